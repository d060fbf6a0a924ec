"""``python -m comfy_memx [memx options] [--] path/to/main.py [ComfyUI args...]`` and the sub-commands.

ComfyUI must behave exactly as under ``python main.py ...``: it sees the same argv (its argparse rejects unknown
flags, so our options are consumed before the script path), ``sys.path[0]`` is main.py's folder, it runs as
``__main__`` through ``runpy.run_path`` (every ``if __name__ == "__main__"`` block fires), and its exit status,
Ctrl-C and SIGTERM behave as usual because nothing here catches them.  Nothing imports torch or ``comfy.*`` first.
"""

import os
import runpy
import sys

from comfy_memx.core.errors import MemxError

COMMANDS = {
    "demo": "comfy_memx.cli.demo",
    "doctor": "comfy_memx.cli.doctor",
    "fleet": "comfy_memx.cli.fleet",
    "free": "comfy_memx.cli.free",
    "report": "comfy_memx.cli.report",
}
LEAK_FAIL_STATUS = 3
USAGE = """usage: python -m comfy_memx [options] [--] path/to/ComfyUI/main.py [ComfyUI args...]
       python -m comfy_memx {commands} [--help]

Runs ComfyUI's main.py in this process with comfy_memx's patches applied.

options (each is also an environment variable):
{options}
  -h, --help            show this help and exit
  --version             print the comfy_memx version and exit
"""


class UsageError(MemxError):
    """Bad launcher command line; the message is shown with exit status 2."""


def _options():
    from comfy_memx.core.config import SETTINGS
    return {s.flag: s for s in SETTINGS if s.option}


def usage():
    """The launcher's --help text, generated from the settings table."""
    lines = [f"  {flag} VALUE".ljust(24) + " " + f"{s.env}: {s.accepted}" for flag, s in _options().items()]
    return USAGE.format(commands="{" + ",".join(COMMANDS) + "}", options="\n".join(lines))


def split_argv(argv):
    """Split ``argv`` (without the program name) into ({env var: value}, script, script args)."""
    options = _options()
    settings, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, has_value, value = arg.partition("=")
        if name in ("-h", "--help", "--version"):
            raise SystemExit(_print_and_status(name))
        setting = options.get(name)
        if setting is None:
            raise UsageError(f"unknown option {name} (options: {', '.join(options)}; "
                             "put ComfyUI's own options after the path of main.py)")
        if not has_value:
            i += 1
            if i >= len(argv):
                raise UsageError(f"option {name} needs a value ({setting.accepted})")
            value = argv[i]
        settings[setting.env] = value
        i += 1
    if i >= len(argv):
        raise UsageError("missing path/to/ComfyUI/main.py")
    return settings, argv[i], list(argv[i + 1:])


def _print_and_status(name):
    if name == "--version":
        from comfy_memx._version import __version__
        print(f"comfy_memx {__version__}")
    else:
        print(usage())
    return 0


def check_script(path):
    """Fail with a clear message unless ``path`` is a readable Python file; returns its absolute path."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"cannot run {path}: no such file")
    try:
        with open(path, "rb") as f:
            source = f.read()
        compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as exc:
        raise UsageError(f"cannot run {path}: not a Python script ({exc.__class__.__name__}: {exc})") from None
    return path


def run_script(path, args):
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and its folder at ``sys.path[0]``."""
    sys.argv[:] = [path, *args]
    if not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
        if sys.path:
            sys.path[0] = os.path.dirname(path)
        else:
            sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def main(argv=None):
    """Entry point of ``python -m comfy_memx``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS and not argv[0].endswith(".py"):
        import importlib
        sys.exit(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]))
    try:
        settings, script, args = split_argv(argv)
        path = check_script(script)
    except UsageError as exc:
        print(f"comfy_memx: {exc}\n(see python -m comfy_memx --help)", file=sys.stderr)
        sys.exit(2)
    os.environ.update(settings)
    from comfy_memx.core.bootstrap import bootstrap
    try:
        cfg = bootstrap("launcher")
    except MemxError as exc:
        print(f"comfy_memx: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        run_script(path, args)
    except SystemExit as exc:
        if exit_status(exc.code) == 0:
            _leak_fail_exit(cfg)
        raise  # ComfyUI's own non-zero status is kept: --leak-fail only turns a clean exit into 3
    _leak_fail_exit(cfg)


def exit_status(code):
    """The process exit status that ``SystemExit(code)`` gives: None is 0, an int itself, anything else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _leak_fail_exit(cfg):
    if not getattr(cfg, "leak_fail", False):
        return
    from comfy_memx.leaks import watch
    leaked = sorted(watch.rooted_leaks())
    if leaked:
        print(f"comfy_memx: {len(leaked)} model(s) leaked with a rooted holder ({', '.join(leaked)}); "
              f"exiting with status {LEAK_FAIL_STATUS}", file=sys.stderr)
        sys.exit(LEAK_FAIL_STATUS)
