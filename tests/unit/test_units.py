"""The one byte formatter that log lines, reports and commands share."""

import pytest

from comfy_memx.core.units import format_bytes


@pytest.mark.parametrize("nbytes, text", [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                          (1536, "1.5 KiB"), (5 * 2 ** 30, "5.0 GiB"), (3 * 2 ** 40, "3.0 TiB"),
                                          (2 ** 62, "4194304.0 TiB"), (-1536, "-1.5 KiB")])
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text
