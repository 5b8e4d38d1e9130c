from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def fixture_text(name: str) -> str:
    """A recorded/synthesised /proc text without its provenance comment ('#' lines)."""
    lines = (DATA / name).read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith("#"))
