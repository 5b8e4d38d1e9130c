"""Partition the full-size fp16 Anima DiT with ``split``: time against ``cp`` of its weights, and peak RSS.

Builds the model (28 blocks, hidden 2048, fp16, external data, ~3.9 GB) with
:func:`tests.models.anima.build_anima_onnx` unless ``--model`` is given (``--blocks`` /
``--hidden`` build a reduced one).  Then, ``--runs`` times, interleaved on the same disk:

- ``cp``: ``cp --reflink=never`` of the model's external-data file into the work folder (a real
  copy even where cp would reflink; no fsync, as a
  user would time it), and ``cp+sync``: the same followed by ``sync -f`` of that file system;
- ``split --weights copy`` and ``split --weights link``, each in a fresh subprocess so that
  its peak RSS (``wait4`` rusage of that process alone) is the partitioner's.

With ``--baseline DIR`` (another rkpart source tree, e.g. ``git archive main | tar -x -C DIR``)
its ``split --weights copy`` and ``link`` run too, interleaved in the same rounds, as
``copy@base`` / ``link@base``.

Prints medians of the ``partition()`` call's wall and CPU time (load + discover + extract +
write + the final flush), of the whole process (interpreter start and imports too), the
ratios to ``cp`` measured in the same run (wall, and CPU against cp's CPU), peak RSS, the
load average during each round and the work folder's file system.  The machine may be shared:
compare ratios of one run, not absolute times across runs.  Targets (issue 15): copy <= 1.5x
cp, link <= 0.2x cp, peak RSS <= 1 GiB.  ``link`` is only free where the file system can
reflink (XFS, Btrfs); elsewhere it copies the data file whole (docs/partition.md says why a
hard link cannot be used).

Files go under ``--workdir`` (default ``/tmp/rkpart_bench_full``) and are deleted at the end
unless ``--keep``.

Usage: ``.venv/bin/python bench/partition_full.py [--model PATH] [--workdir DIR] [--runs 3]
[--baseline DIR] [--blocks N --hidden H] [--keep]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("copy", "link")
TARGETS = {"copy": 1.5, "link": 0.2}
RSS_TARGET = 1 << 30


def _child(model: Path, out: Path, weights: str) -> int:
    """Runs in the measured subprocess: timings as one JSON line on stdout."""
    from rkpart.pipeline import partition

    w0, c0 = time.perf_counter(), time.process_time()
    plan = partition(model, out, "split", force=True, weights=weights)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(json.dumps({
        "wall": wall, "cpu": cpu, "npu_stages": len(plan.npu_stages), "host_stages": len(plan.host_stages),
        "blocks": len(plan.blocks), "stage_weight_bytes": sum(s.weight_bytes for s in plan.stages),
        "linked": (plan.extra.get("weights") or {}).get("files", {}),
    }))
    return 0


def _data_files(model: Path) -> list[Path]:
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    files = {e.value for i in m.graph.initializer for e in i.external_data if e.key == "location"}
    return [model.parent / f for f in sorted(files)]


def _run_measured(args: list[str], pythonpath: Path | None = None) -> tuple[str, float, float, float]:
    """Run ``args``; return (stdout, wall s, CPU s of the child, peak RSS bytes of the child)."""
    env = dict(os.environ)
    if pythonpath is not None:  # the rkpart tree measured, not whatever the venv has installed
        env["PYTHONPATH"] = str(pythonpath)
    t = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"child {' '.join(args[:4])}... failed with exit code {code}")
    return out, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024.0  # KiB on Linux


def _cp(files: list[Path], dst: Path, sync: bool) -> tuple[float, float]:
    dst.mkdir(parents=True, exist_ok=True)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(["cp", "--reflink=never", *map(str, files), str(dst)], check=True)
    if sync:
        subprocess.run(["sync", "-f", str(dst)], check=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(dst)
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def _fstype(path: Path) -> str:
    """The file system type of ``path`` (``/proc/self/mounts``: the longest mount point above it)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, fs = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, f"{fs} ({dev})"
    return kind


def _build(model: Path, blocks: int | None, hidden: int | None) -> None:
    over = {}
    if blocks:
        over["num_blocks"] = blocks
    if hidden:
        over.update(hidden=hidden, ffn_dim=4 * hidden, heads=max(1, hidden // 128))
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "  # the example models: tests/models/
            "from tests.models.anima import AnimaConfig, build_anima_onnx; "
            f"build_anima_onnx(AnimaConfig.full(**{over!r}), {str(model)!r}, external_data=True)")
    _, wall, _, rss = _run_measured([sys.executable, "-c", code], pythonpath=ROOT)
    print(f"built {model} in {wall:.1f} s (builder peak RSS {rss / 2**20:.0f} MiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, help="an existing model (default: build the full-size one)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rkpart_bench_full"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--blocks", type=int, help="build a reduced model with this many blocks")
    parser.add_argument("--hidden", type=int, help="build a reduced model with this hidden size")
    parser.add_argument("--keep", action="store_true", help="keep the model and plans")
    parser.add_argument("--baseline", type=Path, help="another rkpart source tree to measure side by side")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "OUT", "WEIGHTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(Path(args.child[0]), Path(args.child[1]), args.child[2])

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        model = args.model
        if model is None:
            model = work / "model" / "anima_fp16.onnx"
            model.parent.mkdir(exist_ok=True)
            _build(model, args.blocks, args.hidden)
        files = _data_files(model)
        size = model.stat().st_size + sum(f.stat().st_size for f in files)
        data = sum(f.stat().st_size for f in files)
        print(f"model {model}: {size / 2**30:.2f} GiB ({data / 2**30:.2f} GiB external data in {len(files)} file(s))")
        variants = [*MODES, *([f"{m}@base" for m in MODES] if args.baseline else [])]
        order = ["cp", "copy", "cp+sync", "link", *variants[2:]]
        times: dict[str, list[float]] = {k: [] for k in order}
        cpu: dict[str, list[float]] = {k: [] for k in order}
        proc: dict[str, list[float]] = {k: [] for k in order}
        rss: dict[str, float] = {}
        last: dict[str, dict] = {}
        loads: list[float] = []
        fstype = _fstype(work)
        for run in range(args.runs):
            for what in order if run % 2 == 0 else order[::-1]:
                if what.startswith("cp"):
                    w, c = _cp(files, work / "cp", sync=what == "cp+sync")
                    pw = w
                else:
                    mode, _, base = what.partition("@")
                    out = work / f"plan_{mode}"
                    tree = args.baseline.resolve() if base else ROOT
                    text, pw, _, r = _run_measured(
                        [sys.executable, __file__, "--child", str(model), str(out), mode], pythonpath=tree)
                    rec = json.loads(text.strip().splitlines()[-1])
                    w, c = rec["wall"], rec["cpu"]
                    rss[what] = max(rss.get(what, 0.0), r)
                    last[what] = rec
                    shutil.rmtree(out)
                times[what].append(w)
                cpu[what].append(c)
                proc[what].append(pw)
            loads.append(os.getloadavg()[0])
            print(f"run {run + 1}/{args.runs} (load {loads[-1]:.1f}): "
                  + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        medc = {k: statistics.median(v) for k, v in cpu.items()}
        medp = {k: statistics.median(v) for k, v in proc.items()}
        rec = last["copy"]
        print(f"\nplan: {rec['npu_stages']} NPU + {rec['host_stages']} host stages, {rec['blocks']} blocks, "
              f"{rec['stage_weight_bytes'] / 2**30:.2f} GiB of stage weights")
        linked = ", ".join(f"{k} ({v['linked']})" for k, v in last["link"]["linked"].items())
        print(f"work folder {work}: {fstype}; link: {linked or 'nothing'}; "
              f"load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
        print(f"{'':<12}{'wall s':>8}{'CPU s':>7}{'process s':>10}{'x cp':>7}{'x cp+sync':>10}{'CPU x cp':>9}"
              f"{'process x cp':>13}{'RSS MiB':>8}")
        ok = True
        for k in times:
            line = f"{k:<12}{med[k]:>8.2f}{medc[k]:>7.2f}{medp[k]:>10.2f}"
            if k not in ("cp", "cp+sync"):
                ratio = med[k] / med["cp"]
                line += (f"{ratio:>7.2f}{med[k] / med['cp+sync']:>10.2f}{medc[k] / medc['cp']:>9.2f}"
                         f"{medp[k] / med['cp']:>13.2f}{rss[k] / 2**20:>8.0f}")
                mode = k.partition("@")[0]
                good = ratio <= TARGETS[mode] and rss[k] <= RSS_TARGET
                if k in MODES:
                    ok &= good
                line += f"  target <= {TARGETS[mode]}x cp, RSS <= 1024 MiB: {'ok' if good else 'MISSED'}"
            print(line)
        print(f"(medians of {args.runs} interleaved runs; wall and CPU of the partition() call inside its own "
              "process; 'process' adds interpreter start and imports)")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
