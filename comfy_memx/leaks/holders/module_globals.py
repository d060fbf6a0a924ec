"""Which module globals hold an object, and whether they are all that holds it: a heap scan saved per chain.

Most leaked models hang below a module global (a cache dict, a registry list); the backward search's last level
before such a root is a scan of the whole heap that only finds the module's ``__dict__``.  The references of every
module ``__dict__`` are few (tens of thousands, against a million objects in the heap), so they are read once per
search, at C speed, into a set of ids; an object in that set whose reference count is fully named by the module
dicts that hold it and by live frames' local variables (``direct`` of
:class:`~comfy_memx.leaks.holders.search.ThreadLocals`) has no other holder, and its roots are known without a scan.
Any reference left unnamed (an object outside the modules, a reference from C code, a container of the search's own)
sends the object to the scan as before: counting can only save a scan, never hide a holder.

Nothing here keeps a module dict past a call: the search may hold none while ``gc.get_referrers`` runs.
"""

import gc
import itertools
import operator
import sys
import types

from comfy_memx.leaks.holders.packages import module_namespace


def refs_beyond_search(seen, obj_id):
    """References to ``seen[obj_id]`` other than the search's own: its ``seen`` dict and its frontier list.

    The value read from ``seen`` is getrefcount's argument, the third reference taken off.
    """
    return sys.getrefcount(seen[obj_id]) - 3


def _counts_as_expected():
    """True when :func:`refs_beyond_search` counts as it expects on this interpreter (a fresh list, held so)."""
    sample = []
    sample_id = id(sample)
    seen, frontier = {sample_id: sample}, [sample]
    del sample
    try:
        return refs_beyond_search(seen, sample_id) == 0
    finally:
        seen.clear()
        frontier.clear()


#: Whether the search may settle objects by counting here; where not, every object is scanned as before.
COUNTS_AS_EXPECTED = _counts_as_expected()


def _module_dicts_now(known):
    """The live ``__dict__`` of every module in ``sys.modules`` whose id is in ``known`` (each once)."""
    found = {}
    for module in list(sys.modules.values()):
        if issubclass(type(module), types.ModuleType):
            namespace = module_namespace(module)
            if id(namespace) in known:
                found[id(namespace)] = namespace
    return list(found.values())


class ModuleGlobals:
    """The ids module dicts reference (read once, lazily), and the module dicts that hold one object.

    ``known`` is the search's ``{id(module dict): name}`` (only those dicts are module-global roots there).
    """

    __slots__ = ("known", "_referenced")

    def __init__(self, known):
        self.known = known
        self._referenced = None

    def may_hold(self, obj_id):
        """True when some module dict referenced the object with this id when the index was read."""
        if self._referenced is None:
            dicts = _module_dicts_now(self.known)
            self._referenced = frozenset(map(id, gc.get_referents(*dicts)))
            dicts.clear()
        return obj_id in self._referenced

    def holders(self, obj):
        """``[(module dict, references to obj)]`` for every module dict that references ``obj`` now."""
        found = []
        for namespace in _module_dicts_now(self.known):
            count = sum(map(operator.is_, gc.get_referents(namespace), itertools.repeat(obj)))
            if count:
                found.append((namespace, count))
        return found
