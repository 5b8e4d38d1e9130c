"""The whole grid of the board's samplers against diffusers' real schedulers (torch needed).

``tests/runtime/test_board_sampling.py`` runs a sample of this grid; this runs every case of
``tests/runtime/sampling_oracle.py`` (the published configs of the sweep's pipelines and the option
variations) at every step count and seed asked, and prints one line per case: the worst loop error
and whether the schedules were equal.  Exit 1 if any case fails.

``--other-python PY`` also runs ``board_sampling.py`` alone (NumPy only) under another interpreter,
e.g. a venv with NumPy 1.26 or the board's Python, on every case at 1, 2, 3, 20 and 50 steps with
NumPy noise, and checks its timesteps, sigmas and final latents byte-identical to this one's.

Usage: ``.venv/bin/python scripts/check_samplers.py [--steps 1,2,3,...] [--seeds N] [--case NAME ...]
[--other-python PY]``
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/runtime/sampling_oracle.py

from rkpart.runtime import board_sampling
from tests.runtime.sampling_oracle import PUBLISHED, VARIATIONS, Case, loop_error, max_rel, schedule_mismatches

DEFAULT_STEPS = "1,2,3,4,5,8,10,14,15,16,20,25,28,30,40,50"


#: run by each interpreter: board_sampling.py loaded by path (NumPy only), every case, NumPy noise
RUNNER = """
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("sampling", sys.argv[1])
bs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bs)
res = {}
for c in json.load(open(sys.argv[2])):
    for n in (1, 2, 3, 20, 50):
        key = c["name"] + "/" + str(n)
        try:
            s = bs.make_scheduler(c["cls"], c["config"])
            ts, _ = bs.retrieve_timesteps(s, n, rule=c["rule"], mu=c["mu"])
            rng = np.random.default_rng(0)
            shape = tuple(c["shape"])
            w = (rng.standard_normal((c["out"], shape[1])) / np.sqrt(shape[1])).astype(np.float32)
            x = (rng.standard_normal(shape) * s.init_noise_sigma).astype(np.float32)
            for t in ts:
                y = np.einsum("oc,bchw->bohw", w, s.scale_model_input(x, t)).astype(np.float32) * np.float32(0.7)
                y[:, shape[1]:] = np.abs(y[:, shape[1]:]) * np.float32(0.01)  # a learned variance is positive
                x = s.step(y, t, x, generator_noise=rng.standard_normal)
            res[key + "/timesteps"], res[key + "/latent"] = np.asarray(s.timesteps), x
            if s.sigmas is not None:
                res[key + "/sigmas"] = np.asarray(s.sigmas)
        except bs.SamplerError as e:
            res[key + "/refused"] = np.array(str(e))
np.savez(sys.argv[3], **res)
print(np.__version__)
"""


def other_python(python: str, cases: list[Case]) -> int:
    """Byte-identical results under ``python`` (another NumPy) and this interpreter, or 1."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = [{"name": c.name, "cls": c.cls, "config": dict(c.config), "rule": c.rule, "mu": c.mu,
                 "shape": list(c.shape), "out": c.model_channels or c.shape[1]} for c in cases]
        (Path(tmp) / "cases.json").write_text(json.dumps(spec))
        versions, results = [], []
        for i, exe in enumerate((sys.executable, python)):
            out = Path(tmp) / f"{i}.npz"
            p = subprocess.run([exe, "-c", RUNNER, board_sampling.__file__, str(Path(tmp) / "cases.json"), str(out)],
                               capture_output=True, text=True, timeout=3600)
            if p.returncode:
                print(f"check_samplers: error: {exe} failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            versions.append(p.stdout.strip())
            results.append(dict(np.load(out)))
        a, b = results
        keys = sorted(set(a) | set(b))
        differ = [k for k in keys if k not in a or k not in b or a[k].dtype != b[k].dtype
                  or a[k].tobytes() != b[k].tobytes()]
        print(f"NumPy {versions[0]} ({sys.executable}) vs NumPy {versions[1]} ({python}): "
              f"{len(keys) - len(differ)} of {len(keys)} arrays byte-identical")
        for k in differ[:20]:
            print(f"    differs: {k}")
        return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", default=DEFAULT_STEPS, help=f"step counts [default: {DEFAULT_STEPS}]")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of model, latent and noise per count [2]")
    parser.add_argument("--case", action="append", help="only these cases (repeatable; default: all)")
    parser.add_argument("--other-python", metavar="PY",
                        help="also check board_sampling byte-identical under this interpreter (e.g. NumPy 1.x)")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    cases = [c for c in PUBLISHED + VARIATIONS if not args.case or c.name in args.case]
    if args.case and len(cases) != len(set(args.case)):
        known = ", ".join(c.name for c in PUBLISHED + VARIATIONS)
        print(f"check_samplers: error: unknown case in {args.case} (known: {known})", file=sys.stderr)
        return 2
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    failed = 0
    start = time.process_time()
    print(f"{'case':24} {'class':34} {'worst rel':>10} {'min cosine':>14} {'refused':>8}  schedule")
    for case in cases:
        worst, min_cos, refused, bad = 0.0, 1.0, 0, []
        for n in steps:
            bad += [f"{n} steps: {m[:120]}" for m in schedule_mismatches(case, n)]
            for seed in range(args.seeds):
                r = loop_error(case, n, seed)
                if r.both_refused:
                    refused += 1
                    continue
                if not r.ok(max_rel(case)):
                    bad.append(f"{n} steps, seed {seed}: {r}")
                if r.max_rel == r.max_rel:  # not NaN
                    worst, min_cos = max(worst, r.max_rel), min(min_cos, r.cosine)
        failed += bool(bad)
        print(f"{case.name:24} {case.cls:34} {worst:10.2e} {min_cos:14.12f} {refused:8d}  "
              f"{'FAIL' if bad else 'equal'}", flush=True)
        for b in bad[:5]:
            print(f"    {b}")
    print(f"{len(cases)} cases x {len(steps)} step counts x {args.seeds} seeds: {failed} failed "
          f"({time.process_time() - start:.0f} s CPU)")
    if args.other_python:
        failed += other_python(args.other_python, cases)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
