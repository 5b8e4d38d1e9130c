"""Golden plans: the sha256 of every file of a fixed set of plans, recorded from a known-good tree.

``tests/integrity/test_golden_plans.py`` partitions the same set and compares, so a refactoring
that changes what rkpart writes fails.  Regenerating the record is a deliberate act::

    PYTHONPATH=. python -m tests.integrity.golden_plans      # rewrites golden_plans.json

The model's absolute path (``model.path`` in plan.json) depends on where the tree is checked
out; it is replaced by ``<MODEL>`` before plan.json is hashed.  Every other byte counts.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("golden_plans.json")

#: (case name, strategy, strategy options) over the bundled example
CASES: tuple[tuple[str, str, Mapping[str, Any]], ...] = (
    ("split", "split", {}),
    ("split-adaln-npu", "split", {"adaln": "npu"}),
    ("fused", "fused", {}),
    ("fused-x2", "fused", {"blocks_per_stage": 2}),
    ("generic", "generic", {}),
    ("auto", "auto", {}),
)


def digest(folder: Path, model: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path (plan.json with the model path masked)."""
    out: dict[str, str] = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        data = f.read_bytes()
        if rel == "plan.json":
            data = data.replace(json.dumps(str(model.resolve())).encode(), b'"<MODEL>"')
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def compute(root: Path) -> dict[str, dict[str, str]]:
    """Partition every case under ``root`` and digest each plan folder."""
    from rkpart.cli_args import bundled_example
    from rkpart.pipeline import partition

    model = bundled_example()
    out = {}
    for name, strategy, opts in CASES:
        folder = root / name
        partition(model, folder, strategy, **opts)
        out[name] = digest(folder, model)
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        record = compute(Path(tmp))
    RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RECORD} ({sum(map(len, record.values()))} files in {len(record)} plans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
