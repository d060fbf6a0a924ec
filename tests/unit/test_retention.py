"""Allocator retention versus held bytes: RSS readings, malloc_trim, and what live models hold in RAM."""

import platform
import sys

import pytest

from comfy_memx.core.bootstrap import bootstrap
from comfy_memx.core.state import STATE
from comfy_memx.surface import retention

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="malloc_trim is glibc's")


def test_rss_is_read_and_grows_with_touched_memory():
    before = retention.rss_bytes()
    block = bytearray(64 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])     # touch every page
    after = retention.rss_bytes()
    assert before > 0 and after - before >= 48 * 1024 * 1024
    del block


@glibc
def test_trim_returns_the_pages_the_allocator_kept_after_a_free():
    chunks = [bytearray(1024) for _ in range(150_000)]    # ~150 MiB of small malloc'd blocks (heap, not mmap)
    for chunk in chunks:
        chunk[0] = 1
    del chunks                                             # freed, but glibc keeps most of the pages
    result = retention.trim()
    assert result["returned_bytes"] > 50 * 1024 * 1024 and result["seconds"] >= 0
    assert result["rss_after_trim"] > 0


def test_trim_is_skipped_with_the_reason_when_turned_off():
    bootstrap("api", {"COMFY_MEMX_TRIM": "0"})
    assert retention.trim() == {"skipped": "COMFY_MEMX_TRIM=0"}
    assert STATE.config.trim is False


def test_held_bytes_counts_the_cpu_resident_weights_of_live_models():
    rows = [{"bytes_by_device": {"cuda:0": 100, "cpu": 30}}, {"bytes_by_device": {"cpu": 12}},
            {"bytes_by_device": {}}, {"bytes_by_device": {"mps": 5}}]
    assert retention.held_bytes(rows) == 42
