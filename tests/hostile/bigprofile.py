"""A large profile made from a real one: its measured round repeated with seeded jitter.

``rkpart report`` on a 110 000-record profile once drew one subplot per round (issue 31:
past 5.7 GB RSS at 300 s).  The readers of profile files are checked on such files by
:mod:`tests.hostile.test_big_profile`; ``python -m tests.hostile.bigprofile SRC OUT N``
writes one by hand for measuring (``/usr/bin/time -v rkpart report OUT ...``).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from rkpart.profile import records as rec


def _jitter(r: dict[str, Any], rng: random.Random) -> None:
    t = r.get("timings", {})
    for k, v in list(t.items()):
        if isinstance(v, float):
            t[k] = v * rng.uniform(0.9, 1.1)


def grow_profile(src: Path, out: Path, n_records: int, *, seed: int = 0) -> int:
    """Write to ``out`` a valid profile of about ``n_records`` records grown from the real
    profile ``src`` (its first measured round repeated); the number written is returned."""
    lines = rec.read_jsonl(src)
    header = {k: v for k, v in lines[0].items() if k in ("format", "version", "run_id", "env", "settings", "plan")}
    warm = [r for r in lines if r["record"] != "summary" and r.get("warmup")]
    first = min(r["round"] for r in lines if r["record"] == "round" and not r["warmup"])
    one = [r for r in lines if r["record"] != "summary" and r.get("round") == first]
    rounds = max(1, (n_records - 1 - len(warm)) // len(one))
    rng = random.Random(seed)
    body: list[dict[str, Any]] = [*warm]
    n = 0
    with open(out, "w") as f:
        for r in warm:
            f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")
            n += 1
        for k in range(rounds):
            for r in one:
                c = json.loads(json.dumps(r))
                c["round"] = first + k
                _jitter(c, rng)
                f.write(json.dumps(c, sort_keys=True, separators=(",", ":")) + "\n")
                n += 1
                if k < 3:
                    body.append(c)
        s = rec.summary_record(header, body)  # the summary of the first rounds: the readers do not recompute it
        s["rounds_measured"] = list(range(first, first + rounds))
        f.write(json.dumps(s, sort_keys=True, separators=(",", ":")) + "\n")
    return n + 1


if __name__ == "__main__":
    print(grow_profile(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
