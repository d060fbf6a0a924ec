"""Reference counts as comfy_memx reports them: ``sys.getrefcount`` minus comfy_memx's own references.

Every place that counts the references of a model (the unload's refcounts, a leak's reading) takes
``sys.getrefcount(obj)`` with the object in exactly one local variable of its own frame; those two references (the
local and getrefcount's argument) are comfy_memx's, not the holders'.
"""

OWN_REFS = 2  # the caller's local variable and getrefcount's own argument


def external_refcount(obj_refcount):
    """``sys.getrefcount`` taken by a frame holding the object in one local, minus those two own references."""
    return max(0, obj_refcount - OWN_REFS)
