"""Byte counts in words: the one formatter every report and progress line uses.

A leaf module (it imports nothing from rkpart).  Binary units throughout: ``MB`` in messages
means 2**20 bytes, as the toolkit's own memory reports do.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1 << 10
MIB: Final = 1 << 20
GIB: Final = 1 << 30


def human_bytes(n: int | float) -> str:
    """``1.2 GB`` at or above a GiB, else ``310 MB``: for progress lines, messages and tables."""
    return f"{n / GIB:.1f} GB" if n >= GIB else f"{n / MIB:.0f} MB"


def mib(n: int | float) -> str:
    """``n`` bytes as MiB with two decimals (``12.34``): the number in ``... MiB`` columns."""
    return f"{n / MIB:.2f}"


__all__ = ["GIB", "KIB", "MIB", "human_bytes", "mib"]
