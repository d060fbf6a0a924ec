"""Stand-in for ``comfy/options.py``: main.py flips ``args_parsing`` on before anything imports cli_args."""

args_parsing = False


def enable_args_parsing(enable=True):
    """Let the first import of ``comfy.cli_args`` parse ``sys.argv`` (only main.py calls this)."""
    global args_parsing
    args_parsing = enable
