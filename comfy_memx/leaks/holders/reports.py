"""The results of a holder search: plain data (strings and numbers only, never the objects searched).

A report must be safe to keep, log and serialise after the search: it holds no reference to the target or to
any object on a chain, so keeping reports can never cause the leak they describe.
"""

import dataclasses
import json

STAGE_CYCLE = "cycle"
STAGE_ROOTED = "rooted"
RESULT_FOUND = "found"
RESULT_NOT_FOUND = "not_found"
RESULT_INCOMPLETE = "incomplete"
#: What a complete search cannot see: the only holders a "not found" answer can mean.
NOT_SEEN = ("a reference from C code (an extension's own storage)", "an object the garbage collector does not track",
            "the objects comfy_memx itself ignores (its ledger, the caller's frames)")


@dataclasses.dataclass(frozen=True)
class HolderChain:
    """One reference chain from a root to the target.

    ``path`` is a Python-like access path (``some_pack.model.QwenImageModel._cache['k']``); ``package`` is the
    custom-node package, ``core`` or top-level package owning the root; ``root_kind`` is one of
    ``module_global``, ``class_attribute``, ``thread_frame``, ``c_registry``; ``depth`` counts the references
    from the root object to the target.  ``stage`` says which stage of the search found it: ``probe`` (the forward
    walk from the custom-node packages and ComfyUI's long-lived objects) or ``backward`` (the heap-scanning search
    from the target).  ``kinds`` names the type of every object on the chain (root first, target last), which is
    what the holder patterns read; ``inner_package`` is the custom-node package of the innermost object on the chain
    whose class a pack defines (a pack's node instance kept by ComfyUI's cache, say), or None.  ``steps`` is the
    chain as :mod:`~comfy_memx.leaks.holders.steps` writes it, for walking it again by identity (``()`` when it
    cannot be: a root that is no module global or class attribute, or a reference through a closure, a slot, C code).
    ``mappings`` names the types on the chain that are mapping classes (:mod:`~comfy_memx.leaks.holders.containers`:
    a ``WeakKeyDictionary``, a ``cachetools`` cache, a pack's own mapping class), which the patterns read as a
    pack's registry.
    """

    path: str
    package: str
    root_kind: str
    depth: int
    stage: str = "backward"
    kinds: tuple = ()
    inner_package: str = None
    steps: tuple = ()
    mappings: tuple = ()


@dataclasses.dataclass
class HolderReport:
    """What :func:`~comfy_memx.leaks.holders.find_holders` found (stage ``rooted``: the target survived a collect).

    ``complete`` is False when the time budget, ``max_depth`` or ``max_chains`` cut the search short
    (``stopped_by`` names which); the chains found until then are still listed, shortest first.

    ``stages`` has the figures of each stage: ``probe`` (``seconds``, ``objects_visited``, ``reached``: whether
    the forward walk met the target, ``unexplained``: how many objects it connected to the target still had a
    holder it did not see, ``chains``, ``stopped_by``, ...) and ``backward`` (``mode``: ``skipped`` when the probe
    named every holder, ``remaining`` when it climbed only from what the probe could not explain, ``full`` when
    it searched from the target as without a probe; ``seconds``, ``scans``, ``objects_visited``, ``chains``).
    ``objects_visited`` and ``scans`` above are the totals of both.
    """

    target: str
    chains: list
    seconds: float
    objects_visited: int
    scans: int
    complete: bool
    stopped_by: str = None
    note: str = ""
    stage: str = STAGE_ROOTED
    stages: dict = dataclasses.field(default_factory=dict)
    cpu_seconds: float = 0.0

    @property
    def result(self):
        """``found`` (at least one chain), ``not_found`` (none after a complete search: only then can the holder
        be said to be out of the search's sight) or ``incomplete`` (none, and the search stopped early)."""
        if self.chains:
            return RESULT_FOUND
        return RESULT_NOT_FOUND if self.complete else RESULT_INCOMPLETE

    def as_dict(self):
        """The report as JSON-ready builtins."""
        return dataclasses.asdict(self)

    def to_json(self):
        """The report as one JSON document (a string)."""
        return json.dumps(self.as_dict(), sort_keys=True)

    def search_summary(self):
        """The search's figures as JSON-ready builtins (a leak event's ``search`` object), stage by stage."""
        return {"result": self.result, "seconds": round(self.seconds, 4), "cpu_seconds": round(self.cpu_seconds, 4),
                "objects_visited": self.objects_visited, "scans": self.scans,
                "complete": self.complete, "stopped_by": self.stopped_by,
                "found_by": {stage: sum(chain.stage == stage for chain in self.chains)
                             for stage in ("probe", "backward")},
                "stages": json.loads(json.dumps(self.stages))}

    def lines(self):
        """Human-readable log lines: a summary, then one line per chain."""
        state = "complete" if self.complete else f"incomplete ({self.stopped_by})"
        backward = (self.stages.get("backward") or {}).get("mode")
        how = f", backward search {backward}" if backward else ""
        head = (f"{self.target} is held by {len(self.chains)} chain(s); search {state}, "
                f"{self.objects_visited} objects, {self.scans} heap scans, {self.seconds * 1000:.0f} ms{how}")
        body = [f"  [{chain.package}] {chain.path}  ({chain.root_kind}, {chain.stage})" for chain in self.chains]
        if self.note:
            body.append(f"  note: {self.note}")
        return [head] + body

    def __str__(self):
        return "\n".join(self.lines())


@dataclasses.dataclass
class CycleReport:
    """Evidence captured before a full collect: the reference cycle that held the target (stage ``cycle``).

    ``members`` are short type-based descriptions (``#0`` is the target); ``edges`` are
    ``(from_member, label, to_member)`` with access-path labels (``.peer``, ``['k']``,
    ``-> closure 'model'``); ``text`` is the same in one line.  ``ancestors`` counts every object found that
    could reach the target.  ``chains`` lists roots that also held the target at capture time (a target that
    is rooted survives the collect).  ``collected`` is filled in by :func:`~comfy_memx.leaks.holders.investigate`:
    True when the collect then freed the target.
    """

    target: str
    members: list
    edges: list
    text: str
    ancestors: int
    seconds: float
    objects_visited: int
    scans: int
    complete: bool
    stopped_by: str = None
    chains: list = dataclasses.field(default_factory=list)
    collected: bool = None
    stage: str = STAGE_CYCLE
    cpu_seconds: float = 0.0

    def as_dict(self):
        """The report as JSON-ready builtins."""
        return dataclasses.asdict(self)

    def to_json(self):
        """The report as one JSON document (a string)."""
        return json.dumps(self.as_dict(), sort_keys=True)

    def lines(self):
        """Human-readable log lines."""
        state = "complete" if self.complete else f"incomplete ({self.stopped_by})"
        return [f"{self.target} was held by a reference cycle ({self.ancestors} objects could reach it; "
                f"capture {state}, {self.seconds * 1000:.0f} ms)", f"  {self.text}"]

    def __str__(self):
        return "\n".join(self.lines())


def _dot_quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(report):
    """Graphviz text for a report: the cycle's members and labelled edges, or each chain as a path.

    Example: ``dot -Tsvg`` of ``to_dot(capture_cycle(model))`` draws the cycle.

    .. versionadded:: 0.1
    """
    out = ["digraph holders {", "  node [shape=box, fontsize=10];"]
    if isinstance(report, CycleReport):
        for index, member in enumerate(report.members):
            out.append(f"  m{index} [label={_dot_quote(f'#{index} {member}')}];")
        for source, label, dest in report.edges:
            out.append(f"  m{source} -> m{dest} [label={_dot_quote(label.strip())}];")
    else:
        out.append(f"  target [label={_dot_quote(report.target)}, style=bold];")
        for index, chain in enumerate(report.chains):
            out.append(f"  c{index} [label={_dot_quote(f'[{chain.package}] {chain.root_kind}')}];")
            out.append(f"  c{index} -> target [label={_dot_quote(chain.path)}];")
    out.append("}")
    return "\n".join(out) + "\n"
