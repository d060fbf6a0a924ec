"""When this ComfyUI instance last did something: prompt starts and ends, noted by the execution patch.

A part of the process state; reading and writing it are attribute accesses (the idle check runs once a second).
"""

import time

from comfy_memx.core.state import STATE


class Activity:
    """The time of the last prompt start or end (monotonic seconds), and how many prompts run now."""

    def __init__(self):
        self.last = time.monotonic()
        self.running = 0
        self.prompts = 0


def activity():
    """This process's :class:`Activity`."""
    return STATE.part(Activity)


def prompt_started():
    """A prompt starts executing (the execution patch calls this)."""
    now = activity()
    now.running += 1
    now.prompts += 1
    now.last = time.monotonic()


def prompt_ended():
    """A prompt ended (successfully or not)."""
    now = activity()
    now.running = max(0, now.running - 1)
    now.last = time.monotonic()
