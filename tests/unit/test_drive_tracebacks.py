"""The real-tree harness tells a failure's traceback from the one the stop's own SIGINT makes asyncio log."""
import sys
import textwrap

from bench.harness import drive, waits

# A server shaped like ComfyUI's main: an event loop whose tasks are busy when the signal lands, and an
# ``except KeyboardInterrupt`` around run_until_complete.
BUSY_LOOP = textwrap.dedent("""
    import asyncio, sys

    async def busy():
        while True:
            sum(range(10 ** 6))   # the signal lands in this task's step
            await asyncio.sleep(0)

    async def main():
        task = asyncio.ensure_future(busy())
        print("ready", flush=True)
        await asyncio.sleep(3600)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    except KeyboardInterrupt:
        print("Stopped server", flush=True)
    {after}
""")

KEYBOARD_INTERRUPT = """Task exception was never retrieved
future: <Task finished name='Task-4' coro=<RequestHandler.start() done> exception=KeyboardInterrupt()>
Traceback (most recent call last):
  File "/x/main.py", line 571, in <module>
    event_loop.run_until_complete(x)
  File "/x/selectors.py", line 368, in unregister
    self._selector.unregister(key.fd)
KeyboardInterrupt
"""

VALUE_ERROR = """Traceback (most recent call last):
  File "/x/nodes.py", line 3, in load
    raise ValueError("bad")
ValueError: bad
Prompt executed in 0.1 seconds
"""


def test_tracebacks_name_each_exception_line():
    found = drive.tracebacks("boot\n" + VALUE_ERROR + "\x1b[33mWARNING\x1b[0m x\n" + KEYBOARD_INTERRUPT)
    assert [exception for _, exception in found] == ["ValueError: bad", "KeyboardInterrupt"]
    assert found[0][0].splitlines()[-1] == "ValueError: bad"


def test_a_keyboard_interrupt_after_the_sigint_is_the_signal_and_every_other_traceback_a_failure():
    assert drive.failure_tracebacks("serving\n", KEYBOARD_INTERRUPT) == []
    assert len(drive.failure_tracebacks(KEYBOARD_INTERRUPT, "")) == 1       # before the SIGINT nothing interrupts
    assert len(drive.failure_tracebacks("", VALUE_ERROR + KEYBOARD_INTERRUPT)) == 1
    assert len(drive.failure_tracebacks(VALUE_ERROR, "")) == 1


def stopped_by_sigint(tmp_path, after):
    """Start the busy loop (``after`` runs once ComfyUI's except has caught the interrupt), stop it as the harness
    stops ComfyUI; returns the server and its log split at the SIGINT."""
    script = tmp_path / "server.py"
    log = tmp_path / "server.log"
    script.write_text(BUSY_LOOP.format(after=after))
    server = drive.ComfyServer([sys.executable, str(script)], str(tmp_path), {}, str(log), 0)
    server.start()
    waits.wait_until(lambda: "ready" in log.read_text(), waits.process_alive(server.process), waits.no_progress,
                     "the server's ready line")
    server.stop()
    text = log.read_text()
    return server, text[:server.interrupted_at], text[server.interrupted_at:]


def test_a_server_stopped_by_sigint_while_a_task_runs_leaves_no_failure(tmp_path):
    server, serving, interrupted = stopped_by_sigint(tmp_path, "loop = None; import gc; gc.collect()")
    assert server.process.returncode == 0 and server.stop_method == "SIGINT"
    assert "Stopped server" in interrupted and "KeyboardInterrupt" in interrupted   # asyncio logged the task's
    assert drive.failure_tracebacks(serving, interrupted) == []


def test_a_traceback_after_the_sigint_that_is_not_the_signal_is_a_failure(tmp_path):
    server, serving, interrupted = stopped_by_sigint(tmp_path, "raise RuntimeError('shutdown hook failed')")
    assert server.process.returncode == 1
    failures = drive.failure_tracebacks(serving, interrupted)
    assert [failure.splitlines()[-1] for failure in failures] == ["RuntimeError: shutdown hook failed"]
