"""The command line: the launcher (``python -m comfy_memx main.py ...``) and its sub-commands.

``launcher`` (runs ComfyUI's main.py in this process), ``demo``, ``doctor``, ``fleet``, ``free`` and ``report``; each
sub-command module has a ``main(argv)`` that returns the exit status.
"""
