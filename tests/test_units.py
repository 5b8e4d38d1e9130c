"""rkpart.units: the one byte formatter."""

from __future__ import annotations

from rkpart.units import human_bytes, mib


def test_one_byte_formatter() -> None:
    assert human_bytes(310 * 2**20) == "310 MB"
    assert human_bytes(int(1.25 * 2**30)) == "1.2 GB"
    assert mib(3 * 2**19) == "1.50"
