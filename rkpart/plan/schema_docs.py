"""Regenerate the JSON schemas in ``docs/``: ``python -m rkpart.plan.schema_docs docs``.

The plan schema (:mod:`rkpart.plan.schema`) and the custom-spec schema
(:mod:`rkpart.grouping.strategies.custom`) are the source of truth; a test keeps the files equal to them.
This module lives with the strategies because it is the lowest layer that sees both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rkpart.grouping.strategies.custom import spec_schema_json
from rkpart.io import atomic_write_bytes
from rkpart.plan.schema import schema_json


def write_schema_docs(docs: str | os.PathLike[str]) -> list[Path]:
    """Write ``plan.schema.json`` and ``custom-spec.schema.json`` into ``docs``."""
    out = []
    for name, text in (("plan.schema.json", schema_json()), ("custom-spec.schema.json", spec_schema_json())):
        dest = Path(docs) / name
        atomic_write_bytes(dest, text.encode())
        out.append(dest)
    return out


if __name__ == "__main__":  # pragma: no cover - regenerates the JSON schemas in docs/
    for written in write_schema_docs(sys.argv[1] if len(sys.argv) > 1 else "docs"):
        print(written)
