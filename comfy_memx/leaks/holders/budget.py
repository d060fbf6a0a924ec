"""What a holder search may spend: its own CPU time, with a wall-clock safety cap.

A search runs on a busy machine (other processes on the cores, other Python threads holding the GIL).  Wall-clock
time spent waiting for a core or for the GIL is not work the search did, so a budget counted in wall time gives
an answer that depends on the load: the same search finds the holder on an idle machine and gives up on a busy
one.  A :class:`Budget` counts the calling thread's CPU time (``time.thread_time``), which only moves while the
search itself runs, and stops the search only when a larger wall-clock cap (:data:`WALL_FACTOR` times the CPU
allowance, plus :data:`WALL_SLACK_S`) is reached as well, so that a starved search cannot hold a prompt forever.
"""

import time

WALL_FACTOR = 5.0
WALL_SLACK_S = 1.0
STOP_BUDGET = "budget"
STOP_WALL = "wall_cap"


class Budget:
    """The CPU-time allowance of one search stage, started when the object is made.

    ``cpu_s`` is the CPU time the stage may use; ``wall_s`` its wall-clock safety cap (default
    ``WALL_FACTOR * cpu_s + WALL_SLACK_S``).
    """

    __slots__ = ("cpu_s", "wall_s", "cpu_started", "wall_started")

    def __init__(self, cpu_s, wall_s=None):
        self.cpu_s = max(0.0, float(cpu_s))
        self.wall_s = self.cpu_s * WALL_FACTOR + WALL_SLACK_S if wall_s is None else max(0.0, float(wall_s))
        self.cpu_started = time.thread_time()
        self.wall_started = time.perf_counter()

    def cpu_spent(self):
        """CPU seconds this thread used since the budget started."""
        return time.thread_time() - self.cpu_started

    def wall_spent(self):
        """Wall-clock seconds since the budget started."""
        return time.perf_counter() - self.wall_started

    def left(self):
        """CPU seconds left, never more than the wall-clock seconds left under the cap (0 when spent)."""
        return max(0.0, min(self.cpu_s - self.cpu_spent(), self.wall_s - self.wall_spent()))

    def stop_reason(self):
        """``None`` while work may go on, else why it must stop: :data:`STOP_BUDGET` or :data:`STOP_WALL`."""
        if self.cpu_spent() >= self.cpu_s:
            return STOP_BUDGET
        if self.wall_spent() >= self.wall_s:
            return STOP_WALL
        return None

    def sub(self, cpu_s):
        """A budget for a part of this stage: at most ``cpu_s``, never more than what is left here."""
        return Budget(min(float(cpu_s), self.left()), wall_s=max(0.0, self.wall_s - self.wall_spent()))
