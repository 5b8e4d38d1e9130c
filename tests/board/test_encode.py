"""``rkpart encode``: a prompt through the pipeline's own text encoders, as the call arguments ``--embeds`` takes.

The oracle is diffusers' own ``encode_prompt`` of the same pipeline (tiny real T5 and tokenizer from
tests/models/pipelines.py), not rkpart's inversion of the hooked transformer call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.board import images as im

pytestmark = [pytest.mark.export, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_encode_writes_what_diffusers_encode_prompt_gives(tmp_path: Path) -> None:
    import torch
    from click.testing import CliRunner

    from rkpart.cli import main
    from tests.export.exports import cached_pipeline_export

    src = im.tp.cached_pipeline("pixart_sigma", text_encoders=True)
    description = cached_pipeline_export("pixart_sigma") / "pipeline.json"
    out = tmp_path / "E.npz"
    r = CliRunner().invoke(main, ["encode", str(src), "--pipeline", str(description), "--prompt", "a red cat",
                                  "--negative-prompt", "blurry", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    got = dict(np.load(out))
    assert sorted(got) == ["negative_prompt_attention_mask", "negative_prompt_embeds", "prompt_attention_mask",
                           "prompt_embeds"]
    pipe = im.tp.load(src)
    with torch.no_grad():
        pe, pm, ne, nm = pipe.encode_prompt("a red cat", do_classifier_free_guidance=True, negative_prompt="blurry",
                                            max_sequence_length=6)
    for key, want in (("prompt_embeds", pe), ("prompt_attention_mask", pm), ("negative_prompt_embeds", ne),
                      ("negative_prompt_attention_mask", nm)):
        assert got[key].shape == tuple(want.shape), key
        np.testing.assert_allclose(got[key], want.float().numpy(), rtol=0, atol=1e-6, err_msg=key)
    assert not np.array_equal(got["prompt_embeds"], got["negative_prompt_embeds"])
    # the same prompt again: byte-identical file
    again = tmp_path / "again.npz"
    r = CliRunner().invoke(main, ["encode", str(src), "--pipeline", str(description), "--prompt", "a red cat",
                                  "--negative-prompt", "blurry", "-o", str(again), "-q"])
    assert r.exit_code == 0 and again.read_bytes() == out.read_bytes()

    # a pipeline folder without text encoders (the tiny export's own): one line, nothing written
    bare = im.tp.cached_pipeline("pixart_sigma")
    r = CliRunner().invoke(main, ["encode", str(bare), "--pipeline", str(description), "--prompt", "a red cat",
                                  "-o", str(tmp_path / "none.npz"), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "has no text encoders" in r.stderr, r.stderr
    assert not (tmp_path / "none.npz").exists()
