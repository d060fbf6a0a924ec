"""The fault suite's sites, found by walking comfy_memx's code, and the planting of one failure in each.

A *site* is a function a fault can be planted in:

* every function and method a wing defines (``ledger``, ``pins``, ``leaks``, ``sharing``, ``surface``: their modules'
  functions, and the methods, static and class methods and property accessors of their classes): where a bug of
  comfy_memx can be, as the reviewer planted them;
* every guarded call a patch makes: each subscriber of each signal and pair (``core.signals``) and each entry of each
  guarded facade (``core.guard``).  All of them are wing functions but core's own subscribers (the startup line, the
  audit of replaced wrappers), which are added here.

This is a superset of what a patch can reach: a call from a patch enters a wing only through a guarded call, and
everything a guarded call reaches is a wing function (or core, whose guards and pairs are the machinery under test).
Functions made at run time (closures a factory returns, lambdas) have no name to walk; the functions that make them
are sites.

Planting swaps a function's code object for one that raises :class:`Planted`, so every reference to the function (an
alias another module imported, a subscription, a facade's guarded call) meets the fault, as it would meet a bug
there.  :class:`Garden` plants and restores, counts each raise per site, and notes which sites a run reached
(:func:`reached`).  Used by ``tests/patches/test_fault_injection.py`` on the stand-ins and, inside a real ComfyUI
process, by ``tests/real/fault_world.py``.
"""

import collections
import importlib
import inspect
import pkgutil
import sys
import threading
import types

WINGS = ("ledger", "pins", "leaks", "sharing", "surface")
RAISER = "__memx_planted__"   # the name planted code calls; put in the planted function's globals while planted


class Planted(Exception):
    """The failure planted in ``site``."""

    def __init__(self, site):
        super().__init__(f"planted in {site}")
        self.site = site


def _members(value):
    """The functions behind a class attribute: a method, a static or class method, a property's accessors."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [fn for fn in (value.fget, value.fset, value.fdel) if isinstance(fn, types.FunctionType)]
    return [value] if isinstance(value, types.FunctionType) else []


def _defined_in(fn, module):
    """``fn`` itself, or the function a decorator wraps (``contextlib.contextmanager``...), when its code is written
    in ``module``'s file; else None (a decorator's wrapper shares its code with every use of the decorator)."""
    fn = inspect.unwrap(fn)
    return fn if isinstance(fn, types.FunctionType) and fn.__code__.co_filename == module.__file__ else None


def wing_modules():
    """Every module of every wing, imported (by name, sorted)."""
    names = []
    for wing in WINGS:
        package = importlib.import_module(f"comfy_memx.{wing}")
        names.append(package.__name__)
        names += [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return {name: importlib.import_module(name) for name in sorted(names)}


def wing_functions():
    """``{"module.qualname": function}`` of every function and method the wings define."""
    found = {}
    for name, module in wing_modules().items():
        candidates = []
        for value in list(vars(module).values()):
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                candidates.append(value)
            elif isinstance(value, type) and value.__module__ == name:
                for member in list(vars(value).values()):
                    candidates += _members(member)
        for fn in filter(None, (_defined_in(candidate, module) for candidate in candidates)):
            found[f"{name}.{fn.__qualname__}"] = fn
    return found


def guarded_calls():
    """``{error kind: function}`` of every guarded call a patch makes: the subscribers of every signal and pair, and
    every facade entry (the subscriptions and the patch modules, with their facades, are imported first)."""
    from comfy_memx.core import guard, registry, signals
    registry.load_patches()
    calls = {}
    for entry in signals.CATALOGUE:
        for fn, kind in entry.guards():
            calls[kind] = fn
    for facade in guard.FACADES:
        for fn, kind in facade.guards():
            calls[kind] = fn
    return calls


def site_name(fn):
    """A function's site name: ``module.qualname``."""
    return f"{fn.__module__}.{fn.__qualname__}"


def all_sites():
    """``{site name: function}``: every wing function, and every guarded call's function (see the module
    docstring), each once."""
    sites = wing_functions()
    for fn in guarded_calls().values():
        sites.setdefault(site_name(fn), fn)
    return dict(sorted(sites.items()))


def _raiser_code(fn, site):
    """A code object that raises ``Planted(site)`` with ``fn``'s free variables (so that it fits ``fn``)."""
    free = fn.__code__.co_freevars
    keep = f"(lambda: ({', '.join(free)},))" if free else "None"   # makes them free here too, never read
    source = (f"def _outer({', '.join(free)}):\n"
              f"    def planted(*_memx_args, **_memx_kwargs):\n"
              f"        {keep}\n"
              f"        raise {RAISER}({site!r})\n"
              f"    return planted\n")
    names = {}
    exec(source, names)   # noqa: S102 (test code, source written above)
    code = names["_outer"](*([None] * len(free))).__code__
    assert code.co_freevars == free, (site, code.co_freevars, free)
    return code


class Garden:
    """Plants failures in ``sites`` (``{name: function}``) and counts how often each raised (``raised``).

    Use it as a context manager around :meth:`plant` / :meth:`unplant`: it leaves every function (and every
    module namespace it lent the raiser to) as it found it."""

    def __init__(self, sites):
        self.sites = sites
        self.raised = collections.Counter()
        self._saved = {}
        self._namespaces = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unplant()

    def _raise(self, site):
        self.raised[site] += 1
        return Planted(site)

    def plant(self, names):
        """Make every site of ``names`` raise :class:`Planted` from now on."""
        for name in names:
            fn = self.sites[name]
            if name in self._saved:
                continue
            namespace = fn.__globals__
            if RAISER not in namespace:
                namespace[RAISER] = self._raise
                self._namespaces[id(namespace)] = namespace
            self._saved[name] = fn.__code__
            fn.__code__ = _raiser_code(fn, name)

    def unplant(self):
        """Give every planted site its own code back."""
        for name, code in self._saved.items():
            self.sites[name].__code__ = code
        self._saved.clear()
        for namespace in self._namespaces.values():
            namespace.pop(RAISER, None)
        self._namespaces.clear()


def reached(sites, run):
    """The names of the sites that ``run()`` called (a profile hook on this thread and the threads it starts);
    returns ``(names, run's answer)``."""
    codes = {id(fn.__code__): name for name, fn in sites.items()}   # by identity: equal code objects compare equal
    seen = set()

    def profile(frame, event, _arg):
        if event == "call":
            name = codes.get(id(frame.f_code))
            if name is not None:
                seen.add(name)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        answer = run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen, answer


def batches(names, size):
    """``names`` in consecutive batches of at most ``size``."""
    names = list(names)
    return [names[start:start + size] for start in range(0, len(names), size)]


# -- what a world showed, and the verdict ------------------------------------------------------------------------

def planted_sites_of(exc):
    """The sites whose planted failure ``exc`` is, or was raised while handling (the holder search reports an
    error as the text of its traceback: that text names the site too)."""
    found = set()
    while exc is not None:
        if isinstance(exc, Planted):
            found.add(exc.site)
        else:
            text = str(exc)
            start = text.find(".Planted: planted in ")
            if start >= 0:
                found.add(text[start + len(".Planted: planted in "):].split()[0])
        exc = exc.__cause__ or exc.__context__
    return found


class ErrorWatch:
    """While installed, sees every call of ``comfy_memx.core.errors.internal_error`` (which still does its work):
    ``reported`` holds the sites whose planted failure reached it (counted), and ``logged`` the kinds the comfy_memx
    logger reported as internal errors."""

    CODE = "def internal_error(kind, exc, answered=False):\n    return __memx_observe__(kind, exc, answered)\n"

    def __init__(self):
        self.reported = collections.Counter()
        self.logged = []
        self._handler = None

    def __enter__(self):
        import logging
        from comfy_memx.core import errors
        self._fn = errors.internal_error
        self._code = self._fn.__code__
        self._original = types.FunctionType(self._code, self._fn.__globals__, "internal_error",
                                            self._fn.__defaults__, self._fn.__closure__)
        self._fn.__globals__["__memx_observe__"] = self._observe
        names = {}
        exec(self.CODE, names)   # noqa: S102 (test code)
        self._fn.__code__ = names["internal_error"].__code__
        watch = self

        class Logged(logging.Handler):
            def emit(self, record):
                message = record.getMessage()
                prefix = "comfy_memx: internal error in "
                if message.startswith(prefix):
                    watch.logged.append(message[len(prefix):].split(" (ComfyUI continues")[0])
        self._handler = Logged(logging.WARNING)
        logger = logging.getLogger("comfy_memx")
        logger.addHandler(self._handler)
        # a log capture up the tree (pytest's) would keep every record, and with it each error's traceback: the
        # frames, and the models in their locals, of every world
        self._propagate, logger.propagate = logger.propagate, False
        return self

    def __exit__(self, *exc):
        import logging
        logger = logging.getLogger("comfy_memx")
        logger.removeHandler(self._handler)
        logger.propagate = self._propagate
        self._fn.__code__ = self._code
        self._fn.__globals__.pop("__memx_observe__", None)

    def _observe(self, kind, exc, answered):
        for site in planted_sites_of(exc):
            self.reported[site] += 1
        return self._original(kind, exc, answered)


class Outcome:
    """What one world showed: ``answers`` (what ComfyUI's calls answered), ``survivors`` (models alive after the
    packs let go), ``raised`` (planted raises per site), ``reported`` (planted failures that reached
    ``internal_error``, per site), ``counts`` (internal errors per kind, as ``/memx/status`` shows them), ``logged``
    (kinds logged), ``reached`` (sites called, when traced)."""

    def __init__(self, answers, survivors, raised, watch, counts, reached=None):
        self.answers, self.survivors, self.raised, self.counts, self.reached = answers, survivors, raised, counts, reached
        self.reported, self.logged = dict(watch.reported), list(watch.logged)


def world_problems(outcome, baseline):
    """What a planted world got wrong as a whole: (a) ComfyUI answered otherwise, (b) a model ComfyUI dropped is
    alive, (c) a site logged more than once, a counted site never logged, an error without a planted fault."""
    failed = []
    if outcome.answers != baseline.answers:
        failed.append(f"(a) ComfyUI answered otherwise: {outcome.answers!r}"[:2000])
    if outcome.survivors:
        failed.append(f"(b) models ComfyUI dropped are alive: {outcome.survivors}"[:2000])
    if len(outcome.logged) != len(set(outcome.logged)) or set(outcome.logged) != set(outcome.counts):
        failed.append(f"(c) logged {outcome.logged}, counted {sorted(outcome.counts)}: each site once")
    if not outcome.raised and outcome.counts:
        failed.append(f"(c) internal errors without a planted fault: {outcome.counts}")
    return failed


def site_problems(site, outcome):
    """What a planted world got wrong about one of its sites that fired: (c) its failure never reached
    ``internal_error`` (so it was neither counted nor logged)."""
    if not outcome.reported.get(site):
        return [f"(c) raised {outcome.raised[site]} times, never counted nor logged"]
    return []


def sweep(run, names, baseline, size):
    """Plant every site of ``names`` (sites a traced world reached) in worlds of ``size`` sites at a time and judge
    them; ``run(batch)`` runs one world with ``batch`` planted and returns its :class:`Outcome`.

    A site whose failure did not fire in its batch (a failure planted before it stopped the path to it) goes back
    into the queue alone; a batch that gets (a), (b) or (c) wrong is split until each failing site is alone.
    Returns ``({site: [problems]}, worlds run)``."""
    order = sorted(names)
    stride = max(1, len(order) // max(1, size))
    queue = [order[start::stride] for start in range(stride)]
    queue = [batch[offset:offset + size] for batch in queue for offset in range(0, len(batch), size)]
    failures, worlds = {}, 0
    while queue:
        batch = queue.pop(0)
        outcome = run(batch)
        worlds += 1
        fired = [site for site in batch if outcome.raised.get(site)]
        silent = [site for site in batch if site not in fired]
        if len(batch) == 1 and silent:
            failures[batch[0]] = ["the planted failure never fired (the traced world reached the site)"]
        else:
            queue += [[site] for site in silent]
        problems = world_problems(outcome, baseline)
        if problems and not fired:    # a world that went wrong with no failure firing: every site of it fails
            failures.update({site: problems for site in batch})
        if problems and len(fired) > 1:
            half = len(fired) // 2
            queue[:0] = [fired[:half], fired[half:]]
            continue
        for site in fired:
            found = problems + site_problems(site, outcome)
            if found:
                failures[site] = found
    return failures, worlds
