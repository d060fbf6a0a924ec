"""Write the configuration reference (``docs/configuration.md``) from the settings table of ``comfy_memx.core.config``.

``python -m comfy_memx.cli.config_reference > docs/configuration.md`` regenerates it; ``tests/unit/test_docs.py``
fails when the checked-in page and this output differ.  Nothing in comfy_memx imports this module: it runs only when
asked for, so the text of each ``Setting.doc`` costs ComfyUI nothing.
"""

import sys

from comfy_memx.core.config import SETTINGS

REGENERATE = "python -m comfy_memx.cli.config_reference > docs/configuration.md"

HEADER = f"""# Configuration

<!-- Generated from the settings table in comfy_memx/core/config.py (each Setting's doc) by
     `{REGENERATE}`; edit the table, not this page. -->

Every setting is an environment variable, read once at start-up; each launcher option sets the same variable
(`python -m comfy_memx --leak-mode strict ...` is `COMFY_MEMX_LEAK_MODE=strict`). A bad value fails fast: the
launcher exits with status 2 before ComfyUI starts, naming the variable, the launcher option and the accepted values;
with `COMFY_MEMX=1` or the node pack the error names the variable (no launcher option: those users have none), is
reported once (on stderr with `COMFY_MEMX=1`; in ComfyUI's log with the node pack; once also when both are in use)
and ComfyUI runs unpatched. An unknown `COMFY_MEMX_*`
variable is warned about at start-up. A node pack reads the same variables (it has no launcher options).

| variable | launcher option | accepted values | default | meaning |
| --- | --- | --- | --- | --- |
"""


def shown_default(value):
    """A default as a reader writes it: ``on``/``off`` for switches, ``unset``, ``none`` for an empty list, ``2``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if value == ():
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def row(setting):
    """One table row of ``setting``: variable, launcher option, accepted values, default, its doc."""
    option = f"`{setting.flag}`" if setting.option else "(environment only)"
    cells = (f"`{setting.env}`", option, setting.accepted, shown_default(setting.default), setting.doc)
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def render():
    """The whole page, as checked in."""
    return HEADER + "\n".join(row(setting) for setting in SETTINGS) + "\n"


def main(argv=None):
    """Print the page on stdout (no arguments)."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
