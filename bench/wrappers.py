"""Added cost of each comfy_memx wrapper on the pass-through path, in microseconds per call.

Each model_management site's wrapper factory is applied to a no-op function of the same shape on an empty
ComfyUI-shaped namespace (no loaded models, so no bookkeeping fires), and compared with calling the no-op
directly: what every call pays for being wrapped.  The bookkeeping itself (owner, bytes, refcounts) runs only on
loads that move bytes and on unloads, and is measured by the cycle ratio of ``bench/overhead.py``.
"""

import statistics
import timeit
import types


class _Entry:
    def __init__(self):
        self.model = None
        self.real_model = None


def _noop(*args, **kwargs):
    return None


def _method_noop(self, *args, **kwargs):
    return None


def run(quick=False):
    """Records ``{"case": "overhead", "metric": "wrapper_added_us", "site": ...}`` for each wrapped site."""
    import sys
    from comfy_memx.core.state import STATE
    from comfy_memx.core.wrapping import Switch
    from comfy_memx.patches import model_management as patch
    mm = types.SimpleNamespace(current_loaded_models=[])
    STATE.reset()
    number = 20000 if quick else 200000
    records = []
    entry = _Entry()
    for site, factory in patch.PATCH.sites.items():
        is_method = site.startswith("LoadedModel.")
        bare = _method_noop if is_method else _noop
        wrapped = factory(mm, bare, Switch())
        args = (entry,) if is_method else (1,)
        if site == "LoadedModel.model_load":
            # the pass-through part of model_load: a patcher-less entry skips the bookkeeping
            args = (entry,)
        samples = []
        for _ in range(5 if quick else 9):
            direct = timeit.timeit(lambda: bare(*args), number=number)
            through = timeit.timeit(lambda: wrapped(*args), number=number)
            samples.append((through - direct) / number * 1e6)
        records.append({"case": "overhead", "metric": "wrapper_added_us", "site": site,
                        "value": round(statistics.median(samples), 3), "min": round(min(samples), 3),
                        "max": round(max(samples), 3), "unit": "us", "target": 0.6})
    return records


if __name__ == "__main__":
    import json
    for record in run(quick="--quick" in __import__("sys").argv):
        print(json.dumps(record))
