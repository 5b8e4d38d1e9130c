"""The board runner's picture with its NPU stages in rknn-toolkit2 2.5.0's simulator, against diffusers' own.

Three families whose samplers differ: Flux (guidance-distilled, FlowMatchEuler with dynamic shift), PixArt-Σ
(DPM-Solver++ with epsilon prediction and learned sigma, batched CFG) and Sana (DPM-Solver with flow
prediction).  The bundle's own ``runner.py`` drives the simulator through the board's ``RKNNLite`` calls
(:mod:`tests.board.sim_rknnlite`: each ``.rknn`` stage built from its ``.onnx`` in the simulator, as ``rkpart run
--backend rknn-sim`` does), every NPU stage resident (one simulator build each).  Flux's and PixArt-Σ's VAE
decoders run in the simulator too (their plans gated by ``rkpart bundle``); Sana's DC-AE decoder fails that
gate in the simulator (NaN) and runs on the host (``--vae auto`` falls back; tested with an injected failure in
test_images.py).  Same tiny models, embeddings, ``latents=``, 20 steps and default guidance as test_images.py;
fp16 on the NPU still gives cosine >= 0.9999 and PSNR >= 35 dB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.board import images as im
from tests.board.sim_rknnlite import sim_rknnlite

pytestmark = [pytest.mark.export, pytest.mark.toolkit, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

VAE = {"flux": "npu", "pixart_sigma": "npu", "sana": "host"}


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    from rkpart.runtime.rknn_sim import RknnSimBackend

    backend = RknnSimBackend()
    yield backend
    backend.close()


@pytest.mark.parametrize("family", list(VAE))
def test_the_runner_in_the_simulator_returns_diffusers_latent_and_image(family: str, board_root: Path,
                                                                         sim: Any) -> None:
    from tests.toolkits import get_toolkit

    plan = im.compiled_plan(family, board_root, get_toolkit("2.5.0"))
    board = im.make_board(plan, board_root / f"{family}-{VAE[family]}-board", vae=VAE[family])
    vae = json.loads((board / "manifest.json").read_text())["vae"]
    assert vae["device"] == VAE[family]
    api = sim_rknnlite([plan, *([Path(vae["plan"])] if vae.get("plan") else [])], sim)
    ref = im.reference(family)
    x, img = im.run_board(board, ref, rknnlite_api=api, residency="resident")
    cos, db = im.cosine(x, ref.latent), im.psnr(img, ref.image)
    assert cos >= im.MIN_COSINE and db >= im.MIN_PSNR, (cos, db)
    ran = {key for method, key in api.calls if method == "inference"}
    stages = json.loads((board / "manifest.json").read_text())["stages"]
    assert {f"{plan.name}:{s['id']}" for s in stages if s["device"] == "npu"} <= ran  # the model's NPU stages ...
    if vae["device"] == "npu":  # ... and the decoder's ran in the simulator
        assert {f"{Path(vae['plan']).name}:{s['id']}" for s in vae["stages"] if s["device"] == "npu"} <= ran
    # resident: each stage built once for the whole loop, not once per step
    inits = [sid for method, sid in api.calls if method == "init_runtime"]
    assert sorted(inits) == sorted(set(inits))
