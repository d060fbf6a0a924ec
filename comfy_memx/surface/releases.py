"""The answer of ``GET /memx/releases``: the receipts of the last releases tried in this process, for the panel's
Released list (a release by its button, by ``free --release`` or by ``COMFY_MEMX_RELEASE=auto`` alike).

The receipts come from the leak wing (``leaks.api.recent_releases``: the last 64, oldest first).  Each is given the
two fields the panel reads whatever version of the release engine wrote it: ``models`` (every model the cut entry
held, ``{model, model_id, bytes, died}``; a receipt without the list names its one model) and ``released_bytes``
(the bytes of the models that died; a receipt without the figure counts its model's ``bytes`` when it died).
Names and numbers only; ``routekit.replies.clip`` makes the answer JSON-safe.
"""

from comfy_memx.leaks import api as leaks

CUT = ("released", "survivor")   # outcomes after which an entry was cut


def models_of(receipt):
    """The models a release's cut entry held: the receipt's ``models``, else its one model."""
    models = receipt.get("models")
    if isinstance(models, list) and models:
        return [model for model in models if isinstance(model, dict)]
    return [{"model": receipt.get("model"), "model_id": receipt.get("model_id"), "bytes": receipt.get("bytes"),
             "died": bool(receipt.get("died"))}]


def released_bytes(receipt):
    """The bytes a release gave back: the receipt's ``released_bytes``, else the bytes of its models that died."""
    given = receipt.get("released_bytes")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    if receipt.get("outcome") not in CUT:
        return 0
    return sum(int(model.get("bytes") or 0) for model in models_of(receipt) if model.get("died"))


def view():
    """``{"capacity", "releases", "released_bytes", "cut"}``: every kept receipt (oldest first) with ``models`` and
    ``released_bytes`` filled in, the bytes they gave back together, and how many of them cut an entry."""
    receipts = [{**receipt, "models": models_of(receipt), "released_bytes": released_bytes(receipt)}
                for receipt in leaks.recent_releases()]
    return {"capacity": leaks.RELEASES_KEPT, "releases": receipts,
            "released_bytes": sum(receipt["released_bytes"] for receipt in receipts),
            "cut": sum(1 for receipt in receipts if receipt.get("outcome") in CUT)}
