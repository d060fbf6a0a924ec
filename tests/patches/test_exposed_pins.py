"""Exposed surface, phantom pins: drift in ComfyUI's TOTAL_PINNED_MEMORY (a lost update, a pin freed without the counter)
is logged once with its amount and protects nothing: no pin is refused for bytes nobody holds, and the budget books
no unattributed pin for it."""

import logging

from comfy_memx.pins import session as pinning
from fake_comfy.loader import make_patcher
from memx_helpers import memx_on
from test_pinning_patch import MiB, checked_register


def pin_all(patcher):
    for key, _ in patcher.model.named_parameters():
        patcher.pin_weight_to_device(key)


def test_drift_in_comfyuis_counter_is_logged_once_and_protects_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    with memx_on("0.27.0", pin_limit="1MiB") as mm:
        backend = checked_register(mm, MiB)
        first = make_patcher(8, 16 * 1024)    # 512 KiB: fits the 1 MiB cap
        pin_all(first)
        mm.TOTAL_PINNED_MEMORY += 3 * MiB     # the counter drifts: nobody registered these bytes
        second = make_patcher(8, 16 * 1024)   # another 512 KiB: still fits, since nobody holds the drift
        pin_all(second)
        stats = pinning.budget().stats()
        assert stats["refusals"] == 0 and backend.violations == []
        assert stats["per_model"].get(pinning.UNATTRIBUTED, 0) == 0
        assert stats["pinned_bytes"] == sum(mm.PINNED_MEMORY.values()) == MiB
        first.unpin_all_weights()
        pin_all(first)                        # more decisions with the drift still there: no second warning
    drift = [r.getMessage() for r in caplog.records if "TOTAL_PINNED_MEMORY" in r.getMessage()]
    assert len(drift) == 1 and "3.0 MiB above" in drift[0]


def test_without_drift_nothing_is_said(caplog):
    with memx_on("0.27.0", pin_limit="1MiB") as mm:
        checked_register(mm, MiB)
        pin_all(make_patcher(8, 16 * 1024))
        assert pinning.budget().stats()["refusals"] == 0
    assert not [r for r in caplog.records if "TOTAL_PINNED_MEMORY" in r.getMessage()]
