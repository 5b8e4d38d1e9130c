#!/usr/bin/env bash
# Fresh machine -> the main job on the bundled tiny Anima-style DiT:
# partition (split and fused), check each plan against the whole model with ONNX Runtime,
# compile the split plan with rknn-toolkit2 2.3.0 and gate it in the toolkit's simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-export
RK=.venv/bin/rkpart
OUT=${1:-build/demo}
$RK inspect
$RK partition --strategy split --out "$OUT/split" --force
$RK run "$OUT/split"
$RK partition --strategy fused --out "$OUT/fused" --force
$RK run "$OUT/fused"
$RK toolkit install 2.3.0
$RK compile "$OUT/split" --toolkit 2.3.0 --target rk3588
$RK run "$OUT/split" --backend rknn-sim --toolkit 2.3.0 --per-stage
