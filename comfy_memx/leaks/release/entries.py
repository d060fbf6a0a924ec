"""Which entry of a walked holder chain is cut: the first, from the pack's root, that holds only this model's objects.

Candidates are the entries of the containers on the chain, from the package's module global or class attribute down,
reached **through containers only**: a dict (``OrderedDict``, ``defaultdict``, any subclass), a list or deque, a
tuple (passed through: its items cannot be cut, so a tuple in a list is removed from the list), a
``functools.lru_cache``, and a mapping object's own storage (a ``WeakKeyDictionary``'s ``.data``, a ``cachetools``
cache's dict, a pack's mapping class: its entry is removed through the object's public ``__delitem__``, see
:func:`comfy_memx.leaks.release.walk.remove`).  The first object on the chain that is none of these (a ModelPatcher,
a node instance, a torch module) ends the candidates.

"This model's objects" are the ledger models built by the same node run as the asked-for one (:func:`node_run`),
ComfyUI's wrappers and clones of them, tensors and plain data: an entry holds only those when the walk of its value
(:func:`~comfy_memx.leaks.release.reach.entry_contents`) reaches no other torch module and no pack cache structure,
within its bounds.  The first such entry from the root is cut (but a dict entry whose value is a list of that one
entry loses the entry, not the list: a pack's ``loaded_objects["ckpt"]`` stays a list); when none is, the deepest
candidate is cut, and the receipt lists every model that died with it.
"""

import collections

from comfy_memx.core.state import STATE
from comfy_memx.leaks.holders.containers import is_mapping_class, torch_kinds
from comfy_memx.leaks.holders.labels import _LRU_WRAPPER
from comfy_memx.leaks.release import reach

FIRST_ENTRY = 2   # steps: 0 the root, 1 the container bound to the module global or class attribute, 2 its entry
ENTRY_OPS = ("item", "index", "lru_item", "lru_entry")


def candidates(chain):
    """Indices of the steps of a walked :class:`~comfy_memx.leaks.release.walk.Chain` whose entry may be cut,
    outermost first (see the module docstring)."""
    objects, steps = chain.objects, chain.steps
    torch_module = torch_kinds()[0]
    found = []
    for index in range(FIRST_ENTRY, len(steps)):
        op, holder_cls = steps[index][0], type(objects[index - 1])
        if op == "attr":
            if not is_mapping_class(holder_cls, torch_module):
                break
        elif op not in ENTRY_OPS:
            break
        elif _cuttable(holder_cls, op):
            found.append(index)
        elif not issubclass(holder_cls, tuple):
            break
        if index + 1 < len(steps) and not _passable(type(objects[index]), torch_module):
            break
    return found


def _cuttable(cls, op):
    if op == "item":
        return issubclass(cls, dict)
    if op == "index":
        return issubclass(cls, list) or _is_deque(cls)
    return cls is _LRU_WRAPPER


def _is_deque(cls):
    return issubclass(cls, collections.deque)


def _passable(cls, torch_module):
    """Whether the chain goes on through an object of ``cls`` as through a container."""
    return (issubclass(cls, (dict, list, tuple, collections.deque)) or cls is _LRU_WRAPPER
            or is_mapping_class(cls, torch_module))


def node_run(record):
    """The ledger records of the models built by the same node run as ``record``'s (``created_by``: prompt and node
    of the ComfyUI loader that built it), ``record`` first; ``[record]`` when it does not say (a model built before
    comfy_memx saw it, or outside a node)."""
    owner = getattr(record, "created_by", None)
    key = (getattr(owner, "prompt_id", None), getattr(owner, "node_id", None))
    if owner is None or key == (None, None):
        return [record]
    same = [other for other in STATE.ledger.records() if other is not record and
            (getattr(getattr(other, "created_by", None), "prompt_id", None),
             getattr(getattr(other, "created_by", None), "node_id", None)) == key]
    return [record, *same]


class Choice:
    """The entry to cut: ``index`` (its step), ``contents`` (the :class:`~comfy_memx.leaks.release.reach.Walked` of
    its value: the models it holds) and ``only`` (whether it holds only this model's objects)."""
    __slots__ = ("index", "contents", "only")

    def __init__(self, index, contents, only):
        self.index, self.contents, self.only = index, contents, only


def choose(chain, indices, group_ids):
    """The :class:`Choice` among the candidate ``indices`` of ``chain``: the first entry whose value holds only the
    models of ``group_ids`` (and their wrappers, tensors, plain data), else the deepest; None when there is none."""
    if not indices:
        return None
    objects = chain.objects
    for position, index in enumerate(indices):
        last = index == indices[-1]
        walked = reach.entry_contents(objects[index], leave_out=[id(obj) for obj in objects[:index]],
                                      allowed=None if last else group_ids)
        if walked.complete and not walked.structure and walked.models <= group_ids:
            return _innermost_alike(chain, indices[position + 1:], Choice(index, walked, True))
        if last:
            return Choice(index, walked, False)
    return None


def _innermost_alike(chain, deeper, choice):
    """The element instead of ``choice`` when ``choice``'s value is a list or deque of that one element in a plain
    dict: a pack's ``loaded_objects["ckpt"]`` list of ``(name, model, clip, vae)`` tuples loses the tuple, not the
    ``"ckpt"`` list that the pack's next load indexes (a ``defaultdict`` makes its list again: its entry is cut)."""
    objects = chain.objects
    value, holder = objects[choice.index], objects[choice.index - 1]
    if (not deeper or deeper[0] != choice.index + 1 or not isinstance(value, (list, collections.deque))
            or len(value) != 1 or isinstance(holder, collections.defaultdict) or not isinstance(holder, dict)):
        return choice
    index = deeper[0]
    walked = reach.entry_contents(objects[index], leave_out=[id(obj) for obj in objects[:index]],
                                  allowed=choice.contents.models)
    if walked.complete and not walked.structure and walked.models == choice.contents.models:
        return Choice(index, walked, True)
    return choice
