"""A ComfyUI call with a "before" and an "after" half, and everything comfy_memx keeps between the two halves.

A wrapper around ComfyUI's ``load_models_gpu`` (or ``model_unload``, ``cleanup_models_gc``, a prompt...) runs the
pair's two halves around ComfyUI's call::

    call = signals.load.before(mm, models, sys._getframe(1))
    try:
        return original(*args, **kwargs)
    finally:
        signals.load.after(call, mm, models)

A wing subscribes its two halves together, ``pair.subscribe(before, after)``: ``before(*before_args)`` returns the
wing's *memo* (what its "after" needs: a byte count, a weakref, an id; None when it has nothing to say), and
``after(memo, *after_args)`` runs only when that memo is not None, so a "before" that failed (or had nothing to
do) leaves nothing and its "after" does nothing: one fault is reported once.  A subscription may have one half only
(``subscribe(before)``, ``subscribe(after=fn)``: then ``fn(*after_args)``, without a memo).

The pair owns the call's record (a list: plan, caller id, subject weakrefs, open flag, memos), never the wing:

* it keeps only ids, weak references and the memos: the caller's frame as its id (:func:`caller` finds the frame
  again on the live stack while the call runs), the ``models`` argument as weak references to its items
  (:func:`subjects`), and memos that hold nothing of ComfyUI but by weakref or id (the wings' rule, tested by the
  fault suite);
* it always unwinds.  A *stacked* pair is one whose calls in progress other code asks about (:meth:`Pair.current`,
  :meth:`Pair.calls`), in one of two ways:

  - ``stacked="frames"`` (the load running now, the unload scope: plain calls, made many times a prompt): the record
    is a local of the wrapper that runs the call (registered with :meth:`Pair.runs_in`), and of the halves while
    they run, and nothing else; the code that asks walks this thread's live stack to those frames.  A call that is
    over is off the stack whatever happened in it (an exception, an interrupt, a failing half), and ComfyUI's calls
    push and pop nothing: the walk is paid by the code that asks, once per load or unload with something to record.
    The "after" half also marks the record closed, for a wrapper frame that outlives its call in a traceback.
    Reading a frame's locals makes a snapshot dict before Python 3.13; it is emptied at once, so no heap search
    sees the wrapper's arguments through it.
  - ``stacked="thread"`` (the prompt: a coroutine whose nodes may run in tasks of their own, off its frames, once a
    prompt): the record is pushed on this thread's ``STATE.stacks.calls`` in "before" and removed in "after"
    whatever its subscribers do (a ``finally``; a "before" that is interrupted removes it too).

  A pair that is not stacked keeps its record nowhere but in the wrapper's local, and when none of its subscribers
  has anything to do after the call its "before" answers None (the wrapper then skips the "after" half and what it
  would measure for it).

Every half runs under the same guard as a signal's subscribers (:meth:`comfy_memx.core.signals.Signal.fire`): an
``Exception`` goes to ``errors.internal_error`` under the kind ``"<pair>.<half> -> <module>.<function>"`` and the
next subscriber still runs; ``errors.UNCHANGED`` and every non-``Exception`` propagate as they are.  Subscribers run
in subscription order in both halves (the bootstrap imports core's subscriptions first, then the wings' in name
order).

The two halves are compiled from the subscriptions (:func:`_compile`, at every subscription change): one straight
line of guarded calls with a fixed argument list and no loop, so that a wrapper whose subscribers have nothing to do
costs little (``bench/wrappers.py`` measures it).  A call begun before a subscription changed is finished by the
halves it began with.  Nothing here imports a wing, torch or ComfyUI.
"""

import linecache
import sys
import weakref

from comfy_memx.core.errors import UNCHANGED, internal_error
from comfy_memx.core.state import STATE

HEADER = 4
"""A record's first items: its plan, the caller frame's id (or None), the weak references of its subjects, and where
the call is in progress (``stacked="frames"``: True until its "after" half ends; ``"thread"``: the thread's stack it
is on; None for a pair that is not stacked); the memos follow, one per subscription."""

STACKS = (False, "frames", "thread")


class Plan:
    """The subscriptions of a pair at one moment and the two halves compiled from them (``before``, ``after``);
    ``slots`` maps each half to the index of its subscription's memo in a record."""
    __slots__ = ("pair", "subscriptions", "slots", "before", "after")

    def __init__(self, pair, subscriptions):
        self.pair = pair
        self.subscriptions = subscriptions
        self.slots = {}
        for index, halves in enumerate(subscriptions):
            for fn in halves:
                if fn is not None:
                    self.slots.setdefault(fn, HEADER + index)


def label(fn):
    """``module.qualname`` of a subscriber: the second part of its error kind."""
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}.{getattr(fn, '__qualname__', None) or repr(fn)}"


class Pair:
    """The two halves of one ComfyUI call; see the module docstring.  ``before_args`` and ``after_args`` name the
    arguments each half is called with (``caller_frame`` and ``models`` among the "before" ones are kept as an id and
    as weak references), ``doc`` says when each half runs, ``stacked`` whether calls in progress can be asked for
    (:meth:`current`) and how they are found: False, ``"frames"`` or ``"thread"`` (see the module docstring)."""

    __slots__ = ("name", "doc", "before_args", "after_args", "stacked", "_subscriptions", "_homes", "before",
                 "after")

    def __init__(self, name, doc, before_args, after_args, stacked=False):
        for argument in (*before_args, *after_args):
            if not argument.isidentifier() or argument.startswith("_"):
                raise ValueError(f"pair {name}: argument names must be identifiers without a leading _, "
                                 f"not {argument!r}")
        if stacked not in STACKS:
            raise ValueError(f"pair {name}: stacked must be one of {STACKS}, not {stacked!r}")
        self.name, self.doc, self.stacked = name, doc, stacked
        self.before_args, self.after_args = tuple(before_args), tuple(after_args)
        self._subscriptions = ()
        self._homes = {}   # code object -> the name of its local that holds a record of this (stacked) pair
        self._recompile()

    def __repr__(self):
        return f"<Pair {self.name}: {len(self._subscriptions)} subscriptions>"

    def subscribe(self, before=None, after=None):
        """Run ``before`` in every call's first half and ``after`` in its second from now on, after the earlier
        subscriptions; returns ``before`` (or ``after`` when there is no ``before``).  Subscribing the same halves
        twice keeps one subscription."""
        if before is None and after is None:
            raise ValueError(f"pair {self.name}: subscribe needs a before or an after half")
        if all(existing != (before, after) for existing in self._subscriptions):
            self._subscriptions = (*self._subscriptions, (before, after))
            self._recompile()
        return before if before is not None else after

    def unsubscribe(self, fn):
        """Drop every subscription that ``fn`` is a half of (nothing happens when there is none)."""
        kept = tuple(pair for pair in self._subscriptions if fn not in pair)
        if kept != self._subscriptions:
            self._subscriptions = kept
            self._recompile()

    def subscriptions(self):
        """``[(before, after), ...]`` in the order the halves run (a missing half is None)."""
        return list(self._subscriptions)

    def subscribers(self):
        """Every subscribed half, "before" halves first."""
        return [fn for fn, _kind in self.guards()]

    def guards(self):
        """Every subscribed half as ``(function, error kind)``, "before" halves first: what the fault suite plants a
        failure in, with the kind its guard reports."""
        found = [(fn, self.kind("before", fn)) for fn, _after in self._subscriptions if fn is not None]
        return found + [(fn, self.kind("after", fn)) for _before, fn in self._subscriptions if fn is not None]

    def kind(self, half, fn):
        """The error kind of ``fn`` as the ``half`` ("before" or "after") of this pair."""
        return f"{self.name}.{half} -> {label(fn)}"

    def runs_in(self, wrapper, local="call"):
        """Register ``wrapper`` as a function that runs calls of this (stacked) pair, keeping the record that
        :attr:`before` returned in its local ``local`` until it called :attr:`after`; returns ``wrapper``.  Every
        patch wrapper of a stacked pair registers (the frames of these functions are where :meth:`current` finds
        the calls in progress)."""
        if self.stacked != "frames":
            raise ValueError(f"pair {self.name}: only a pair stacked by frames finds its calls in wrappers")
        code = getattr(wrapper, "__code__", None)
        if code is None or local not in code.co_varnames:
            raise ValueError(f"pair {self.name}: {wrapper!r} has no local {local!r} to keep its record in")
        self._homes[code] = local
        return wrapper

    def _open_records(self):
        """This thread's records of this pair in progress, innermost first, each once (``stacked="frames"``: a
        record is a local of its wrapper's frame and, while they run, of its halves' frames, adjacent on the
        stack)."""
        if self.stacked == "thread":
            calls = STATE.stacks.calls
            for index in range(len(calls) - 1, -1, -1):
                if calls[index][0].pair is self:
                    yield calls[index]
            return
        homes = self._homes
        last = None
        frame = sys._getframe(2)
        while frame is not None:
            local = homes.get(frame.f_code)
            if local is not None:
                found = frame.f_locals
                call = found.get(local)
                if type(found) is dict:   # a snapshot (before Python 3.13), kept by the frame: emptied so that no
                    found.clear()         # dict holds the wrapper's arguments where a heap search would see them
                if type(call) is list and call[3] and call is not last and call[0].pair is self:
                    last = call
                    yield call
            frame = frame.f_back

    def current(self):
        """This thread's innermost call of this (stacked) pair in progress, or None."""
        return next(self._open_records(), None)

    def calls(self):
        """This thread's calls of this (stacked) pair in progress, outermost first."""
        found = list(self._open_records())
        found.reverse()
        return found

    def memo(self, call, fn):
        """What the subscription that ``fn`` is a half of left in ``call`` (None: nothing, or no such call)."""
        if call is None:
            return None
        slot = call[0].slots.get(fn)
        return call[slot] if slot is not None else None

    def innermost(self, fn):
        """What the subscription that ``fn`` is a half of left in this thread's innermost call of this (stacked)
        pair where it left something (not None), or None."""
        for call in self._open_records():
            slot = call[0].slots.get(fn)
            if slot is not None and call[slot] is not None:
                return call[slot]
        return None

    def _recompile(self):
        plan = _compile(self, self._subscriptions)
        self.before, self.after = plan.before, plan.after
        if self.stacked == "frames":   # the halves hold the record too while their subscribers run
            self._homes[plan.before.__code__] = self._homes[plan.after.__code__] = "_call"


def caller(call):
    """The caller's frame of ``call`` (a stacked pair's record whose "before" took a ``caller_frame``), found on this
    thread's live stack by its id; None once the call is over or when there is none."""
    return frame_on_stack(call[1] if call is not None else None)


def frame_on_stack(frame_id):
    """The frame whose id is ``frame_id`` among the callers of the caller (this thread's live stack), or None.

    A record keeps a caller's frame as its id (a frame holds its locals: ComfyUI's models), and a frame is on the
    stack exactly while the call that noted it runs, so the id names that frame and no other while it is found."""
    if frame_id is None:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if id(frame) == frame_id:
            return frame
        frame = frame.f_back
    return None


def subjects(call):
    """The live items of the ``models`` argument of ``call`` (those already gone are left out)."""
    if call is None:
        return []
    found = []
    for ref in call[2]:
        item = ref()
        if item is not None:
            found.append(item)
    return found


def weak_items(items):
    """Weak references to the items of ``items`` when it is a list or a tuple (an iterator is never consumed);
    items that cannot be weakly referenced are left out."""
    if type(items) is not list and type(items) is not tuple:
        return ()
    try:
        return tuple(map(weakref.ref, items))
    except TypeError:
        refs = []
        for item in items:
            try:
                refs.append(weakref.ref(item))
            except TypeError:
                pass
        return tuple(refs)


def unwind(calls, call):
    """Remove ``call`` from the stack ``calls`` (by identity; nothing when it is not there: a reset came between)."""
    for index in range(len(calls) - 1, -1, -1):
        if calls[index] is call:
            del calls[index]
            return


# -- compiling the halves ----------------------------------------------------------------------------------------

def _guarded(indent, call, kind):
    pad = " " * indent
    return [f"{pad}try:", f"{pad}    {call}", f"{pad}except _UNCHANGED:", f"{pad}    raise",
            f"{pad}except Exception as _exc:", f"{pad}    _internal_error({kind}, _exc)"]


def _before_source(pair, subscriptions, names):
    arguments = ", ".join(pair.before_args)
    lines = [f"def before({arguments}):"]
    slots = ["None"] * len(subscriptions)
    body = []
    for index, (before, after) in enumerate(subscriptions):
        if before is None:
            continue
        names[f"_B{index}"], names[f"_KB{index}"] = before, pair.kind("before", before)
        if pair.stacked:    # every memo is kept: code inside the call may ask for it (Pair.memo)
            call = f"_call[{HEADER + index}] = _B{index}({arguments})"
        else:
            call = (f"_m{index} = " if after is not None else "") + f"_B{index}({arguments})"
            if after is not None:
                slots[index] = f"_m{index}"
        body += _guarded(4, call, f"_KB{index}")
    caller_id = "_id(caller_frame)" if "caller_frame" in pair.before_args else "None"
    items = "_weak_items(models)" if "models" in pair.before_args else "()"
    if not pair.stacked:
        return lines + _flat_before_tail(subscriptions, slots, body, caller_id, items)
    return lines + _stacked_before_tail(pair, slots, body, caller_id, items)


def _flat_before_tail(subscriptions, slots, body, caller_id, items):
    lines = [f"    {slot} = None" for slot in slots if slot != "None"]
    lines += body or ["    pass"]
    memos = [slot for slot in slots if slot != "None"]
    if not any(before is None and after is not None for before, after in subscriptions):
        # every "after" half needs its memo: with none left, the call has nothing to do afterwards
        lines.append(f"    if {' and '.join(f'{memo} is None' for memo in memos) or 'True'}:")
        lines.append("        return None")
    lines.append(f"    return (_PLAN, {caller_id}, {items}, None{''.join(', ' + slot for slot in slots)})")
    return lines


def _stacked_before_tail(pair, slots, body, caller_id, items):
    memos = "".join(", None" for _slot in slots)
    if pair.stacked == "frames":
        return [f"    _call = [_PLAN, {caller_id}, {items}, True{memos}]", *body, "    return _call"]
    lines = ["    _calls = _STATE.stacks.calls",
             f"    _call = [_PLAN, {caller_id}, {items}, _calls{memos}]",
             "    _calls.append(_call)",
             "    try:"]
    lines += ["    " + line for line in body] or ["        pass"]
    return lines + ["    except BaseException:", "        _unwind(_calls, _call)", "        raise", "    return _call"]


def _after_source(pair, subscriptions, names):
    arguments = ", ".join(pair.after_args)
    lines = [f"def after(_call{''.join(', ' + name for name in pair.after_args)}):"]
    if not pair.stacked:
        lines += ["    if _call is None:", "        return"]
    lines += ["    if _call[0] is not _PLAN:",
             f"        return _call[0].after(_call{''.join(', ' + name for name in pair.after_args)})"]
    body = []
    for index, (before, after) in enumerate(subscriptions):
        if after is None:
            continue
        names[f"_A{index}"], names[f"_KA{index}"] = after, pair.kind("after", after)
        if before is None:
            body += _guarded(4, f"_A{index}({arguments})", f"_KA{index}")
        else:
            body += [f"    _m = _call[{HEADER + index}]", "    if _m is not None:"]
            body += _guarded(8, f"_A{index}(_m{''.join(', ' + name for name in pair.after_args)})",
                             f"_KA{index}")
    if not pair.stacked:
        return lines + (body or ["    pass"])
    lines.append("    try:")
    lines += ["    " + line for line in body] or ["        pass"]
    lines.append("    finally:")
    if "caller_frame" in pair.before_args:
        lines.append("        _call[1] = None   # the caller's frame may be gone soon: its id must name no other frame")
    if pair.stacked == "frames":
        lines.append("        _call[3] = False")
        return lines
    lines += ["        _calls = _call[3]",
              "        if _calls[-1] is _call:",
              "            _calls.pop()",
              "        else:",
              "            _unwind(_calls, _call)"]
    return lines


def _compile(pair, subscriptions):
    """The :class:`Plan` of ``subscriptions``: its ``before`` and ``after`` are Python functions written for exactly
    these subscribers (one guarded call each, fixed arguments), compiled once per subscription change."""
    plan = Plan(pair, subscriptions)
    names = {"_PLAN": plan, "_STATE": STATE, "_UNCHANGED": UNCHANGED, "_internal_error": internal_error,
             "_weak_items": weak_items, "_unwind": unwind, "_id": id}
    source = "\n".join(_before_source(pair, subscriptions, names) + _after_source(pair, subscriptions, names)) + "\n"
    filename = f"<comfy_memx pair {pair.name}>"
    exec(compile(source, filename, "exec"), names)   # noqa: S102 (source written above from names only)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show the latest
    plan.before, plan.after = names["before"], names["after"]
    plan.before.__qualname__ = f"{pair.name}.before"
    plan.after.__qualname__ = f"{pair.name}.after"
    return plan
