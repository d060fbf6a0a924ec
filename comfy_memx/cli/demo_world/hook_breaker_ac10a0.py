"""Stand-in for ``hook_breaker_ac10a0.py``: main.py saves ``cast_to`` before custom nodes load and puts it back
afterwards (and after every worker GC pass), so custom nodes cannot keep a hook on it."""
import comfy.model_management

HOOK_BREAK = [(comfy.model_management, "cast_to")]
SAVED_FUNCTIONS = []


def save_functions():
    """Remember the current value of every HOOK_BREAK attribute."""
    for module, name in HOOK_BREAK:
        SAVED_FUNCTIONS.append((module, name, getattr(module, name)))


def restore_functions():
    """Write the remembered values back, undoing any later replacement."""
    for module, name, value in SAVED_FUNCTIONS:
        setattr(module, name, value)
