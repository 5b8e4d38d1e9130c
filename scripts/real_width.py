"""Every image family of the sweep at its published width: partition, predict, compile, tabulate (issue 50).

For each real-width config of :mod:`tests.models.real_width` (``--family`` for a subset, in the order given), as a
user would:

1. the export (TorchScript, float32, weights in one external data file; cached by source);
2. per toolkit (``--toolkit``, default 2.5.0 then 2.3.0) and strategy (``--strategy``, default split then fused):
   ``rkpart partition MODEL -s S --toolkit V``, ``rkpart estimate PLAN --toolkit V --json`` (the memory model's
   prediction of every NPU stage, made before anything is compiled), ``rkpart compile PLAN --toolkit V --json``
   (the default compile: NPU rewrites, **no** ``--repartition``);
3. per NPU stage one row: the layers the build left on the CPU (the plan's ``cpu_ops``), the compiler's weight
   and internal memory (``artifacts[].compiler``), the prediction, the IR's memory features
   (:func:`rkpart.cost_model.device_model.memory_features`, so that ``bench/device_memory.py --rows`` can fit
   on them), the rewrites applied and dropped, the build's time.

Rows go to ``--rows`` (default ``bench/data/real_width.jsonl``: one JSON object per line, a family's rows replaced
when it is run again); ``docs/real-width.md`` (``--out``) is rendered from that file alone, so ``--table-only``
rewrites it without building, and the README's real-width rows (``--readme``, between :data:`README_MARKS`) with it
(``tests/models/test_real_width.py`` checks both are that rendering). Each family runs on a build cache and
placement store of its own (``WORK/cache/<family>``), so what one family's builds teach the store cannot move
another's ops (``scripts/store_crosscheck.py`` then asks what each family's builds taught would have moved
of the others, had they shared one cache), and its placement store is emptied before every partition, so that each
compile is a first build (the build cache stays). The plan folders' weights (``*.data``) are deleted after each
family unless ``--keep-weights``: a real-width plan holds 0.1-2 GB of them per toolkit and strategy; the stage
graphs, plan.json and the builds stay.

Usage: ``.venv/bin/python scripts/real_width.py [--family F ...] [--toolkit V ...] [--strategy S ...]
[--work DIR] [--rows FILE] [--out FILE] [--readme FILE] [--table-only] [--keep-weights] [--timeout S]``.
Needs torch and diffusers (the export) and the toolkits (``$RKPART_TOOLKITS_DIR``).  One family at a time; run it
in the background (``nohup``): a real-width family takes minutes to an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = ROOT / "bench" / "data" / "real_width.jsonl"
OUT = ROOT / "docs" / "real-width.md"
README = ROOT / "README.md"
#: the README's real-width rows sit between these lines (:func:`render_readme`)
README_MARKS = ("<!-- real-width:begin -->", "<!-- real-width:end -->")
TOOLKITS = ("2.5.0", "2.3.0")
STRATEGIES = ("split", "fused")
#: the memory error a budget tolerates (issue 50's target)
TOLERANCE = 0.10
MIB = 1 << 20


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _rkpart(args: Sequence[str], env: Mapping[str, str], log: Path) -> tuple[int, str, float]:
    """Run ``rkpart ARGS`` (the command beside the interpreter running this script); (exit code, stdout, s)."""
    t0 = time.monotonic()
    with log.open("a") as err:
        err.write(f"$ rkpart {' '.join(args)}\n")
        err.flush()
        p = subprocess.run([str(Path(sys.executable).parent / "rkpart"), *args], env=dict(env), stdout=subprocess.PIPE,
                           stderr=err, text=True, check=False)
    return p.returncode, p.stdout, time.monotonic() - t0


def _cpu_ops(artifact: Mapping[str, Any]) -> list[str]:
    """The op types of the layers a build left on the CPU (``cpu_ops`` entries are ``Op:name``)."""
    return sorted(str(op).split(":")[0] for op in artifact.get("cpu_ops") or [])


def _stage_rows(family: str, strategy: str, toolkit: str, plan_dir: Path, estimate: Mapping[str, Any],
                report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per NPU stage of the compiled plan in ``plan_dir``."""
    from rkpart.cost_model.device_model import memory_features
    from rkpart.cost_model.features import stage_features
    from rkpart.plan.plan import load_plan

    plan, folder = load_plan(plan_dir)
    feats = memory_features(plan, folder)
    predicted = {s["id"]: s for s in estimate.get("stages", [])}
    times = {str(s.get("stage")): s.get("wall_s") for s in report.get("stages", []) if isinstance(s, Mapping)}
    doc = json.loads((plan_dir / "plan.json").read_text())
    rows = []
    for s in doc["stages"]:
        if s.get("device") != "npu":
            continue
        arts = [a for a in s.get("artifacts") or [] if a.get("kind") == "rknn" and a.get("toolkit") == toolkit]
        art = arts[-1] if arts else {}
        comp = art.get("compiler") or {}
        pred = predicted.get(s["id"], {})
        prepared = s.get("prepared") or {}
        rows.append({
            "family": family, "shape": "real", "strategy": strategy, "stage": s["id"], "toolkit": toolkit,
            "fit": False, "kind": s.get("kind"),
            "built": bool(art), "failures": [f"{f.get('kind')}: {f.get('message', '')}"[:200]
                                             for f in s.get("failures") or []],
            "cpu_ops": _cpu_ops(art), "weight_bytes": int(comp.get("weight_bytes") or 0),
            "internal_bytes": int(comp.get("internal_bytes") or 0),
            "predicted_bytes": pred.get("device_mem_bytes") if pred.get("device_mem_source") == "predicted" else None,
            "predicted_error": pred.get("device_mem_error"),
            "features": feats[s["id"]].to_json(),
            "stage_features": stage_features(folder, next(x for x in plan.npu_stages if x.id == s["id"])).to_json(),
            "rewrites": dict(prepared.get("rewrites") or {}), "dropped_rewrites": dict(prepared.get("dropped_rewrites")
                                                                                      or {}),
            "build_s": times.get(s["id"]),
        })
    return rows


def run_family(name: str, toolkits: Sequence[str], strategies: Sequence[str], work: Path, timeout: float | None,
               keep_weights: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Export, partition, estimate and compile one family; (its stage rows, its run record)."""
    from rkpart.grouping.learned import PLACEMENT_DIR
    from tests.models.real_width import REAL_WIDTH, cached_real_export

    real = REAL_WIDTH[name]
    fdir = work / name
    fdir.mkdir(parents=True, exist_ok=True)
    log = fdir / "run.log"
    env = {**os.environ, "RKPART_CACHE_DIR": str(work / "cache" / name), "PYTHONPATH": str(ROOT)}
    run: dict[str, Any] = {"family": name, "record": "run", "steps": {}}
    t0 = time.monotonic()
    _say(f"{name}: export")
    try:
        model = cached_real_export(name)
    except Exception as e:  # noqa: BLE001 -- a family that does not export is a row of the table
        run["error"] = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        _say(f"  {run['error']}")
        return [], run
    run["steps"]["export_s"] = round(time.monotonic() - t0, 1)
    rows: list[dict[str, Any]] = []
    for tk in toolkits:
        for strat in strategies:
            plan_dir = fdir / f"{strat}-{tk}"
            key = f"{strat}-{tk}"
            # the first build of this plan: nothing an earlier run (another strategy, toolkit, or an earlier run
            # of this script) taught the placement store may move ops to the host before it (issue 50: the
            # store over-generalises); the build cache stays, a cached build is the same build
            shutil.rmtree(Path(env["RKPART_CACHE_DIR"]) / PLACEMENT_DIR, ignore_errors=True)
            _say(f"{name}: partition -s {strat} --toolkit {tk}")
            code, _, secs = _rkpart(["partition", str(model), "-o", str(plan_dir), "-s", strat, "--toolkit", tk,
                                     "--force", "-q"], env, log)
            run["steps"][f"{key} partition_s"] = round(secs, 1)
            if code:
                run.setdefault("failed", {})[key] = f"partition exit {code}"
                continue
            code, out, _ = _rkpart(["estimate", str(plan_dir), "--toolkit", tk, "--json"], env, log)
            estimate = json.loads(out) if code == 0 else {}
            _say(f"{name}: compile {strat} --toolkit {tk}")
            args = ["compile", str(plan_dir), "--toolkit", tk, "--json"]
            if timeout:
                args += ["--timeout", str(timeout)]
            code, out, secs = _rkpart(args, env, log)
            run["steps"][f"{key} compile_s"] = round(secs, 1)
            try:
                report = json.loads(out)
            except json.JSONDecodeError:
                report = {}
            got = _stage_rows(name, strat, tk, plan_dir, estimate, report)
            rows += got
            built = sum(r["built"] for r in got)
            cpu = sum(len(r["cpu_ops"]) for r in got)
            _say(f"  {name} {strat} {tk}: {built}/{len(got)} built, {cpu} CPU layers, {secs:.0f} s (exit {code})")
            if not keep_weights:
                for f in plan_dir.rglob("*.data"):
                    f.unlink()
    run["steps"]["total_s"] = round(time.monotonic() - t0, 1)
    run.update(hidden=real.hidden, layout=real.layout, text_len=real.text_len)
    return rows, run


# -- the table ---------------------------------------------------------------------------------------------------

def read_rows(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(stage rows, run records) of a rows file."""
    rows, runs = [], []
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                (runs if d.get("record") == "run" else rows).append(d)
    return rows, runs


def write_rows(path: Path, rows: Iterable[Mapping[str, Any]], runs: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, sort_keys=True) for r in (*runs, *rows)]
    path.write_text("".join(f"{ln}\n" for ln in lines))


def _predicted(r: Mapping[str, Any]) -> int | None:
    """The row's prediction: held out (``heldout_bytes``, by the model of its toolkit fitted without its family,
    ``bench/real_width_memory_fit.py --ship``) where its toolkit's model was fitted on these rows, else the one
    ``rkpart estimate`` made when the row was built (``predicted_bytes``)."""
    return r.get("heldout_bytes") or r.get("predicted_bytes")


def _error(r: Mapping[str, Any]) -> float | None:
    device = r["weight_bytes"] + r["internal_bytes"]
    if not _predicted(r) or not device:
        return None
    return float(_predicted(r) or 0) / device - 1


def _ops(rows: Iterable[Mapping[str, Any]]) -> str:
    c = Counter(op for r in rows for op in r["cpu_ops"])
    return ", ".join(f"{n} {op}" for op, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "0"


def _mem_cell(rows: Sequence[Mapping[str, Any]]) -> str:
    errs = [(e, r) for r in rows if (e := _error(r)) is not None and r["weight_bytes"] + r["internal_bytes"] >= MIB]
    if not errs:
        return "-"
    ok = sum(abs(e) <= TOLERANCE for e, _ in errs)
    worst = max(errs, key=lambda er: abs(er[0]))[0]
    return f"{ok}/{len(errs)} within ±10 %, worst {worst * 100:+.1f} %"


#: what the builds' own tables say about the CPU layers and the memory errors above (measured on this page's
#: stages; rendered after the tables, edited by hand when a new measurement changes them)
NOTES = """## Why (from the builds' layer and feature tables)

CPU layers on the first build:

- **HunyuanDiT, 16 x 88**: q/k LayerNorm per head in the heads-first layout [B, H, T, D], then RoPE on
  interleaved pairs. The compiler runs the Transpose it puts after the norm's `exNorm` ((1,88,16,1024) ->
  (1,16,1024,88): "height(1024) * width(88) = 90112, required product no larger than 8192") and the rotation's
  last Reshape ((16,1024,44,2) -> (1,16,1024,88)) on the CPU. `bench/layout_probe.py --pattern norm-rope` (16
  heads, 1024 tokens): the same at 72, 96 and 128, nothing at 64; the norm alone stays on the NPU at every head
  dim, the rotation alone leaves its Reshape on the CPU at 72 and 88. Flux's RoPE (tokens-first, RMSNorm, 128)
  builds with 0 CPU layers. 2.3.0 places the same two layers on the CPU. Removed by the bit-exact rewrite
  `rope-interleaved-matmul` (docs/compile.md): 4 + 2 CPU layers -> 0 on 2.5.0.
- **Lumina-Image-2.0, 24 x 96 with 8 KV heads**: the key/value repeat (after `tile-broadcast`) was laid out with
  the 3 repeats in front and transposed (3,T,8,96) -> (8,3,96,T) on the CPU, for the keys and the values of
  every attention. The masked attentions (caption mask, a stage input) were not fused into `exSDPAttention`: from
  512 query rows on (`bench/layout_probe.py --pattern gqa-tile --mask`: 512 to 1280 rows, 2 or 24 heads; a
  constant mask is fused, 256 rows stay on the NPU unfused) the score Transposes ((24,1280,1,1280)) and
  `exSoftmax13` went to the CPU. Removed by `kv-repeat-gather` (the repeat as one Gather of the KV heads,
  bit-exact) and `masked-attention-row-chunks` (the attention per chunk of 256 query rows, bit-exact):
  7 CPU layers -> 0 on 2.5.0. Device memory: the main attention 285 -> 204 MiB (internal 258 -> 167: a chunk's
  scores), the noise refiner 86 -> 73 MiB (internal 59 -> 39: no repeated keys held), the caption refiner
  47 -> 60 MiB; the Gathers cost 6.8 MiB of weights per attention (27 -> 34 MiB, the compiler's own figure).
  2.3.0 (no repeat Transpose there: the rewrites are 2.5.0's) ran the main attention's score Transpose,
  `exSoftmax13` and probabilities Transpose on the CPU: it does not fuse a Softmax and its product with V that
  `nan-guard`'s "has a key" factor stands between (cut into row chunks it runs each chunk's probabilities
  Transpose on the CPU instead, probe: 3 -> 5). Removed by `guard-after-product` (the factor, 0 or 1 and the same
  for every query row, multiplies V: bit-exact; after the product instead, the fused output's Transpose to it
  stayed on the CPU at 24 heads): 3 -> 0, internal memory 284 -> 62 MiB. Its split cut the caption refiner's
  attention in two around a host `IsNaN`: the partitioner's rewrite probe raised on a placeholder constant
  (`norm-residual-sub` read its value) and rescued nothing; a placeholder has no value now, and `nan-guard`
  keeps the attention whole.
- **Sana, 70 x 32 linear attention**: the value padded with a ones row (32 -> 33) was transposed (1,70,33,1024) ->
  (70,1024,1,33) on the CPU (`--pattern linear-pad`, 1024 tokens: at 70 heads, not at 8, 32 or 64, nor at 70 heads
  of 256 or 512 tokens); 2.3.0 the same after `pad-to-concat`. Removed by `pad-rows-matmul` (the padded rows'
  product apart from the value's, concatenated): 1 -> 0 on 2.5.0 (device memory unchanged) and 2.3.0 (internal
  memory 31.4 -> 44.1 MiB).

- **Cosmos-Predict2 2B, 16 x 128**: the q/k RMSNorm per head in the heads-first layout, as HunyuanDiT's: the
  Transpose after `exNorm` ((1,128,16,1024) -> (1,16,1024,128): "height(1024) * width(128) = 131072, required
  product no larger than 8192") runs on the CPU, in q and k, on 2.5.0 and 2.3.0. The rotate-half RoPE after it
  reads cos/sin tables the stage computes (`Cos`/`Sin` of the position grid: at this width the partitioner copies
  the ops, not the value), so `heads-table-layout`, which moves the heads Transpose past the norm and the RoPE in
  the tiny export, left it alone. Tables computed from constants alone are now moved too (read through a Reshape
  to [1, T, 1, D] the compiler folds; `computed-table-layout` is the same move on 2.3.x): in the tokens layout
  the Transpose after `exNorm` ((1,128,1024,16) -> (1,1024,16,128)) runs on the NPU. `bench/layout_probe.py
  --pattern rms-rope` (4 heads x 1024 tokens at 128, tables computed): that Transpose and the rotate-half's
  Reshape, 2 -> 0. 2 CPU layers -> 0 on 2.5.0 (weight 36.0 -> 32.5 MiB, internal unchanged) and 2.3.0 (weight
  36.0 -> 34.3 MiB, internal 36.5 -> 28.0 MiB).

- **CogView4-6B, 32 x 128** (1024 image + 256 text tokens): the q/k LayerNorm per head in the heads layout, then the
  rotate-half RoPE of the image tokens alone, written back as TorchScript exports `q[:, :, 256:, :] = ...`: a
  `ScatterND` whose indices ([1,32,1024,128,4], 134 MB of int64) the stage computes from four aranges. The
  capability table puts `ScatterND` on the CPU, so `split` cut the attention around it (the RoPE and the ScatterND
  on the host, the attention a second stage), and the first stage's heads-layout outputs ran 3 Transposes on the CPU
  ("height(1280) * width(128) = 163840, required product no larger than 8192"). `slice-assign-concat` writes the
  assignment as a Concat of the text tokens and the rotated ones (bit-exact; the partitioner's rewrite probe now
  gets such an index as the ops computing it, not a placeholder), and `heads-table-layout` (2.5.0) moves the heads
  Transpose past the LayerNorm, the Slices of the tokens axis and the Concat. `bench/layout_probe.py --pattern
  norm-rope-slice --project` (4 heads x 1280 tokens at 128): 2.5.0 the Transpose after `exNorm` and the
  rotate-half's Reshape, 2 -> 0 (internal 39.4 -> 34.1 MB); 2.3.0 the same and the ScatterND, 3 -> 2 (3 -> 0 with
  the norm moved too, which its real width does not survive, below). At its width, split, 2.5.0: one attention stage
  instead of two and a host RoPE, 3 CPU Transposes -> 0 (weight 96.0 + 32.0 -> 128.6 MiB, internal 112.5 and 60.5 ->
  112.5 MiB; `heads-table-layout` weighed: 2 CPU layers without it). Its device memory is under-predicted (-13.2 %,
  held out -14.3 %): the features are counted before the rewrites. 2.3.0 (first run): one attention stage with 2 CPU
  Transposes, the ones after q's and k's `exNorm` (as exported, built once without rewrites: those and the 2
  ScatterNDs, 4); 132.1 + 92.5 MiB. With the norm moved to the tokens layout too (`computed-table-layout` past the
  LayerNorm: 0 CPU layers on the 4-head probe) 2.3.0's build of the stage ran out of memory (killed at 15.8 and 14.6
  GB of RSS; 3.6 GB as exported), so on 2.3.x the move stops at a LayerNorm; this run dropped it after the failed
  build (the row's "(computed-table-layout)"). Left: those 2 Transposes on 2.3.0.
- **First runs of four more families (2026-12-07, split, 2.5.0):** Chroma1-HD and LongCat-Image
  build with 0 CPU layers.
- **FLUX.2-klein-4B, 24 x 128**: its single-stream block's fused projection (`to_qkv_mlp_proj`, 3072 -> 27648,
  1024 image + 512 text tokens) was computed channels-first and its Transpose back to tokens-first ((1,27648,1,1536),
  the compiler's MatMul lowering `..._mm_tp`) ran on the CPU: "channel is too large, may produce thousands of
  regtask, fallback to cpu!", from 8208 output channels on (`bench/layout_probe.py --pattern wide-matmul`: 8192
  stays, at 256 to 4096 tokens; 2.3.0 and 2.3.2 the same). Removed by `wide-matmul-columns` (one MatMul per piece
  the block slices, q, k, v and the MLP's gate and up halves, each at most 8192 wide: bit-exact): 1 CPU layer ->
  0 on 2.5.0, internal memory 261.8 -> 180.8 MiB (weight unchanged, 234.0 MiB). Its FFN's 18432-wide SwiGLU
  projection, sliced into halves that go elementwise into the down projection, stays channels-first: left alone.
- **2.3.0, first runs of the other families (2026-12-08, split):** PixArt-Sigma and SD3.5 Medium build with 0 CPU
  layers. **CogView3-Plus, 64 x 40**: its attention (1024 image + 224 text tokens) runs 2 Reshapes on the CPU, q's
  and k's (1,2560,1,1248) -> (1,40,64,1248): the compiler lays the per-head LayerNorm (`norm_q`, `norm_k`, over
  the head dim of 40) out with the head dim in C and the 64 heads in H for its `exNorm` (`swap_reshape_norm`),
  and builds that Reshape of the projection's channels-first output on the CPU; v's Reshape to the heads layout
  ((1,2560,1,1248) -> (64,40,1,1248)) and both Transposes after the norms stay on the NPU; the build's log gives
  no reason. 2.5.0 builds the stage with 0. `bench/layout_probe.py --pattern norm --heads 64 --head-dim 40
  --tokens 1248 --project --rewrites --toolkits 2.3.0` (q alone through a projection, LayerNorm, attention) builds
  with 0 CPU layers. The stage's attention cut down (q, k, v projected from one input, both norms, the softmax
  scale's square root multiplied into q and into k^T after them, the attention; 64 x 40, 1248 tokens, 2.3.0
  rewrites): the same 2 Reshapes on the CPU, internal memory 65.2 MB; without the two scale Muls 0, 42.3 MB; with
  them folded into the norms' weight and bias by `layernorm-scale-fold` (applied on 2.5.0 only, as a crash
  workaround) 0, 42.3 MB. The fix: `layernorm-scale-fold` on 2.3.0 as a placement rewrite (not exact: the scale
  rounds once more), not made yet (its toolkit test and the 2.3.0 golden digests it changes).
  **LongCat-Image, 24 x 128**: 3 of 4 stages build with 0 CPU layers; the
  single-stream block (`b01.attn_mlp`, 432 MB of weights) did not build on this machine: killed by the OOM killer
  at 12.4 GB of RSS (2.3.0's `tiling_conv_channelin`; 24 GiB shared with the suite and other builds), and
  without `dedupe-constants` stopped as a hang (180 s of CPU, 439 s wall, in the same step); the joint attention
  built only without `dedupe-constants` (13.8 GB with it, killed; 15.3 GB peak without). Not a verdict on 2.3.0:
  run it alone on a machine with the memory free.

Memory (the model fitted on these rows, `bench/real_width_memory_fit.py`; docs/cost-model.md, "Device memory
from the compiler"): a masked attention's scores count as activations (the compiler holds them when it cannot
fuse: Lumina2's main attention -31.2 % -> -4.0 % with the model before). From the feature tables, three terms
more: the partial sums of a MatMul the compiler tiles by input channels (more than 1536: `MatMul#2_tile0`,
`_tile1`, ... summed full-size; every FFN of hidden 1792 and more, and Lumina2's 9216-wide SwiGLU), the key/value
heads a grouped-query attention repeats (Lumina2: the repeated keys held as (8,4,96,T), 3 repeats padded to 4,
and a secondary of (8,8,96,T)), and the attention's workspace above the activation peak with a coefficient of its
own: one coefficient for both scaled a GELU FFN, whose internal memory is exactly the activation peak counted, by
the attention's (+16 % to +18 % before). A SiLU counts as the compiler's `exSwish`, its output held at 2x the
tensor until its gate product reads it (every SwiGLU and conv FFN's table: AuraFlow's FFNs -8 %/-10 % -> -5 %/-6 %,
Lumina2's -10 %/-19 % -> -5 %/-14 %). Still under-predicted, held out: the attentions that kept CPU layers
(CogView4's, FLUX.2's single-stream block; Lumina2's, -17 % to -26 %, before its rewrites; Cosmos's, -13 % before
`heads-table-layout` moved its computed tables: the CPU layer's buffers on both sides of the host round trip; its
rows now are of the build without them, predicted by the shipped model, `*`), Lumina2's unfused masked text-refiner
attention (-21 %: `exSoftmax13` holds a secondary of 4x its scores), its FFN at 1280 tokens (-14 %), Sana's FFN
(-12.5 %) and HunyuanDiT's attention (-12 %): where the allocator places a buffer that does not fit the hole below
it (the attention's secondary at head dim 88; Sana's depthwise Conv input), not a byte count, and PRX's GeGLU FFN
(-11 %: the up projection's tile outputs held beside the gate). Lumina2's rows are of the
build with `kv-repeat-gather` and `masked-attention-row-chunks`: the chunked main attention holds one chunk's
scores, and its refiners hold the Gathers' weights. On 2.3.0 the predictions (`*`) are the shipped predictor's,
fitted on Anima and DiT stages, never on these rows; Lumina2's main attention, +179.6 %, is counted with its
masked scores and nan guard held, as 2.5.0 holds them, where 2.3.0 fuses it after `guard-after-product`
(-17.1 % with the features of every attention fused). Refitted on these rows it does not do better held out
(docs/cost-model.md, "A bound for budgets").
"""


def render(rows: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> str:
    """``docs/real-width.md`` from the rows file's content (deterministic: rows sorted, no clock)."""
    from tests.models.real_width import REAL_WIDTH

    fams = [n for n in REAL_WIDTH if any(r["family"] == n for r in rows) or any(r["family"] == n for r in runs)]
    by_run = {r["family"]: r for r in runs}
    out = [
        "# Image families at their real width",
        "",
        "Generated by `scripts/real_width.py` from `bench/data/real_width.jsonl` (`--table-only` rewrites this page "
        "from the rows; `tests/models/test_real_width.py` checks it is that rendering). Each family is a config of "
        "`tests/models/real_width.py` at the published hidden size, heads, head dim, FFN ratio and text width "
        "(sources in the file), one block of each kind, about 1024 image tokens, the published text length, seeded "
        "float32 weights, exported with TorchScript. Per toolkit and strategy: `rkpart partition -s S --toolkit V`, "
        "`rkpart estimate` (the memory model's prediction, before compiling), `rkpart compile --toolkit V` "
        "(default rewrites, **no** `--repartition`), every family on a build cache of its own and every partition "
        "on an empty placement store: each compile is a first build.",
        "",
        "*CPU layers*: layers the build placed on the CPU inside NPU stages, by op. *Memory*: the prediction made "
        "before compiling against the compiler's own weight + internal memory, NPU stages of 1 MiB or more: held out "
        "(the device-memory model of the toolkit fitted on every other family's rows, "
        "`bench/real_width_memory_fit.py`) where the toolkit's shipped model is fitted on these rows, else (marked "
        "`*` per stage) the shipped model's prediction when the row was built. "
        "*Time*: the family's last run of the script, wall clock on a shared 2-core machine (the export cached after "
        "its first run, builds the build cache already held reused).",
        "",
        "| family | checkpoint | hidden | heads x head dim | text | toolkit | split: built; CPU layers | split: memory "
        "| fused: built; CPU layers | fused: memory | time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in fams:
        real = REAL_WIDTH[n]
        mine = [r for r in rows if r["family"] == n]
        run = by_run.get(n, {})
        tks = [t for t in TOOLKITS if any(r["toolkit"] == t for r in mine)] or ["-"]
        for k, tk in enumerate(tks):
            cells = []
            for st in STRATEGIES:
                rs = [r for r in mine if r["toolkit"] == tk and r["strategy"] == st]
                if not rs:
                    cells += [run.get("failed", {}).get(f"{st}-{tk}", "not run") if tk != "-" else
                              run.get("error", "not run"), "-"]
                    continue
                cells += [f"{sum(r['built'] for r in rs)}/{len(rs)}; {_ops(rs)}", _mem_cell(rs)]
            total = run.get("steps", {}).get("total_s")
            head = (f"| {n} | {real.checkpoint} | {real.hidden} | {real.layout} | {real.text_len} x {real.text_width} "
                    if k == 0 else "| | | | | ")
            out.append(head + f"| {tk} | " + " | ".join(cells)
                       + f" | {f'{total / 60:.0f} min' if total and k == 0 else ''} |")
    out += ["", "## Per stage", "",
            "| family | toolkit | strategy | stage | CPU layers | compiler weight + internal MiB | predicted MiB "
            "| error | rewrites (dropped) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in fams:
        for r in sorted((r for r in rows if r["family"] == n),
                        key=lambda r: (TOOLKITS.index(r["toolkit"]) if r["toolkit"] in TOOLKITS else 9,
                                       STRATEGIES.index(r["strategy"]) if r["strategy"] in STRATEGIES else 9,
                                       r["stage"])):
            err = _error(r)
            comp = (f"{r['weight_bytes'] / MIB:.1f} + {r['internal_bytes'] / MIB:.1f}" if r["built"] else
                    "failed: " + "; ".join(r["failures"])[:80])
            pred = f"{(_predicted(r) or 0) / MIB:.1f}{'' if r.get('heldout_bytes') else '*'}" if _predicted(r) else "-"
            rw = ", ".join(sorted(r["rewrites"])) or "-"
            if r["dropped_rewrites"]:
                rw += " (" + ", ".join(sorted(r["dropped_rewrites"])) + ")"
            out.append(f"| {n} | {r['toolkit']} | {r['strategy']} | {r['stage']} | {_ops([r])} | {comp} | {pred} | "
                       f"{'-' if err is None else f'{err * 100:+.1f} %'} | {rw} |")
    return "\n".join(out) + "\n\n" + NOTES


def render_readme(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README's real-width rows (2.5.0, ``split``), markers included: one line per family."""
    from tests.models.real_width import REAL_WIDTH

    out = [README_MARKS[0],
           "At the published width (one block of each kind, 1024 image tokens, seeded weights; every stage and "
           "toolkit in [docs/real-width.md](docs/real-width.md)), `split` on rknn-toolkit2 2.5.0 from the first "
           "build; memory: the prediction before compiling by a model fitted without the family, against the "
           "compiler's figure, NPU stages of 1 MiB or more:",
           "",
           "| family | hidden | heads x head dim | NPU stages built | CPU layers | memory within ±10 % (worst) |",
           "| --- | --- | --- | --- | --- | --- |"]
    for n, real in REAL_WIDTH.items():
        rs = [r for r in rows if r["family"] == n and r["toolkit"] == "2.5.0" and r["strategy"] == "split"]
        if not rs:
            continue
        mem = _mem_cell(rs).replace(" within ±10 %, worst ", " (").replace("-", "−")
        mem = mem + ")" if "(" in mem else mem
        out.append(f"| {real.checkpoint} | {real.hidden} | {real.layout} | {sum(r['built'] for r in rs)}/{len(rs)} "
                   f"| {_ops(rs)} | {mem} |")
    return "\n".join([*out, README_MARKS[1]])


def readme_with(text: str, block: str) -> str:
    """``text`` (the README) with its real-width rows replaced by ``block``."""
    a, b = text.index(README_MARKS[0]), text.index(README_MARKS[1]) + len(README_MARKS[1])
    return text[:a] + block + text[b:]


def main(argv: list[str] | None = None) -> int:
    from tests.models.real_width import REAL_WIDTH

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", action="append", choices=sorted(REAL_WIDTH), help="a family (repeatable; default all)")
    ap.add_argument("--toolkit", action="append", help=f"toolkit version (repeatable; default {', '.join(TOOLKITS)})")
    ap.add_argument("--strategy", action="append", choices=STRATEGIES, help="default split and fused")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/rkpart-real-width"))
    ap.add_argument("--rows", type=Path, default=ROWS)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--readme", type=Path, default=README, help="the README whose real-width rows are rewritten")
    ap.add_argument("--table-only", action="store_true", help="render --out from --rows, build nothing")
    ap.add_argument("--keep-weights", action="store_true", help="keep the plan folders' weights")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per build (default: compile's)")
    a = ap.parse_args(argv)
    rows, runs = read_rows(a.rows)
    if not a.table_only:
        for name in a.family or list(REAL_WIDTH):
            got, run = run_family(name, a.toolkit or list(TOOLKITS), a.strategy or list(STRATEGIES), a.work,
                                  a.timeout, a.keep_weights)
            done = {(r["toolkit"], r["strategy"]) for r in got}
            # a family's rows of the toolkits and strategies run now are replaced; the others are kept
            rows = [r for r in rows if r["family"] != name or (r["toolkit"], r["strategy"]) not in done] + got
            old = next((r for r in runs if r["family"] == name), None)
            if old is not None and got:
                run["steps"] = {**old.get("steps", {}), **run["steps"]}
            runs = [r for r in runs if r["family"] != name] + [run]
            write_rows(a.rows, rows, runs)
            a.out.write_text(render(rows, runs))
            _say(f"{name}: {run['steps'].get('total_s', 0) / 60:.1f} min; rows -> {a.rows}")
    a.out.write_text(render(rows, runs))
    if a.readme.is_file() and README_MARKS[0] in a.readme.read_text():
        a.readme.write_text(readme_with(a.readme.read_text(), render_readme(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
