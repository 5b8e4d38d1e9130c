"""The derivation of ``pipeline.json`` facts from recordings (:mod:`rkpart.export.describe`), on recordings
built by hand: what each rule accepts and the one line it refuses with.

A hand-made recording here is what :func:`rkpart.export.record.record_call` would record for a toy
pipeline with a known loop (a linear "transformer", an Euler-like step); each test changes one thing
the real pipelines do differently and checks the derived fact, or the refusal.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.export

torch = pytest.importorskip("torch")

from rkpart.export.describe import DescribeError, derive  # noqa: E402
from rkpart.export.record import Recording, Step, TransformerCall  # noqa: E402


def _recording(seed: int, steps: int, g: float, *, mode: str = "batched", t_scale: float = 1.0,
               t_offset: float = 0.0, guidance_factor: float | None = None, learned: bool = False, sign: int = 1,
               extra: Any = None, init: float = 1.0, sigmas: list[float] | None = None, mu: float | None = None,
               combine: str = "uncond + g * (cond - uncond)", renorm: bool = False, zeros: bool = False,
               mask: bool = False, cond_first: bool = False, channels: int | None = None) -> Recording:
    gen = torch.Generator().manual_seed(seed)
    pos, neg = torch.randn(1, 3, 4, generator=gen), torch.randn(1, 3, 4, generator=gen)
    fed_neg = torch.zeros_like(pos) if zeros else neg  # CogView3-Plus: zeros whatever the call's negative is
    latents = torch.randn(1, 2, 2, 2, generator=gen)
    args = {"prompt_embeds": pos, "negative_prompt_embeds": neg, "latents": latents, "guidance_scale": g}
    if mask:  # Chroma: the text mask (int64, padded) and 5 image tokens appended as valid, in bool
        m = torch.ones(1, 3, dtype=torch.int64)
        m[:, 3 - seed % 2 - 1:] = 0
        args.update(prompt_attention_mask=m, negative_prompt_attention_mask=torch.ones_like(m))
    rec = Recording(args=args, init_noise_sigma=init)
    rec.set_timesteps = {"num_inference_steps": steps, "sigmas": sigmas, "mu": mu}
    ts = torch.linspace(1000, 1000 / steps, steps)
    rec.timesteps = ts
    x = latents * init
    for i, t in enumerate(ts):
        def call(batch_latent: Any, ctx: Any, rows: int, t: Any = t, i: int = i) -> TransformerCall:
            kw = {"hidden_states": batch_latent, "encoder_hidden_states": ctx,
                  "timestep": torch.full((rows,), float(t) * t_scale + t_offset), "return_dict": False}
            if guidance_factor is not None:
                kw["guidance"] = torch.full((rows,), g * guidance_factor)
            if extra is not None:
                kw["ids"] = extra(i)
            if mask:
                m = args["prompt_attention_mask"] if ctx is pos else args["negative_prompt_attention_mask"]
                kw["attention_mask"] = torch.cat([m.bool(), torch.ones(1, 5, dtype=torch.bool)], dim=1)
            # each row its own conditioning (a batched pair whose rows differ, as a real model's)
            out = batch_latent * 0.5 + ctx.mean(dim=(1, 2)).reshape(-1, 1, 1, 1) + float(t) * 1e-4
            if learned:
                out = torch.cat([out, -out], dim=1)
            return TransformerCall(kw, out * sign)

        if mode == "batched":
            calls = [call(torch.cat([x, x]), torch.cat([pos, fed_neg] if cond_first else [fed_neg, pos]), 2)]
            uncond, cond = calls[0].output.chunk(2)
            if cond_first:
                uncond, cond = cond, uncond
        elif mode == "two-pass":
            calls = [call(x, fed_neg, 1), call(x, pos, 1)] if zeros else [call(x, pos, 1), call(x, neg, 1)]
            cond, uncond = calls[0].output, calls[1].output
            if zeros:
                cond, uncond = uncond, cond
        else:
            calls = [call(x, pos, 1)]
            uncond = cond = calls[0].output
        mo = ((cond if combine.startswith("cond") else uncond) + g * (cond - uncond)) if mode != "none" else cond
        if channels is not None:
            mo = torch.cat([mo[:, :channels], cond[:, channels:]], dim=1)
        if renorm:
            mo = mo * (cond.norm(dim=-1, keepdim=True) / mo.norm(dim=-1, keepdim=True))
        if learned:
            mo = mo.chunk(2, dim=1)[0]
        mo = mo * sign
        prev = x - 0.1 * mo
        rec.steps.append(Step(calls, t, mo, x, prev))
        x = prev
    rec.result = x
    return rec


def _pair(**kw: Any) -> list[Recording]:
    return [_recording(1, 2, 3.0, **kw), _recording(2, 3, 5.5, **kw)]


def test_batched_cfg_roles_and_sources() -> None:
    f = derive(_pair(), {"guidance_scale": 4.5})
    assert (f.cfg_mode, f.call_batch, f.guidance_scale, f.scale_argument) == ("batched", 2, 4.5, "guidance_scale")
    ctx = f.inputs["encoder_hidden_states"]
    assert (ctx.role, ctx.argument, ctx.negative_argument) == ("text_embeddings", "prompt_embeds",
                                                                 "negative_prompt_embeds")
    assert f.inputs["hidden_states"].role == "latent" and f.latent_input == "hidden_states"
    assert (f.timestep_input, f.timestep_scale, f.timestep_offset) == ("timestep", 1.0, 0.0)
    assert f.fixed == {"return_dict": False} and not f.learned_sigma and f.sign == 1


def test_two_pass_finds_the_conditional_call() -> None:
    f = derive(_pair(mode="two-pass"), {})
    assert f.cfg_mode == "two-pass" and f.cond_call == 0
    assert f.inputs["encoder_hidden_states"].argument == "prompt_embeds"
    assert f.inputs["encoder_hidden_states"].negative_argument == "negative_prompt_embeds"


def test_distilled_guidance_is_not_the_timestep() -> None:
    """Two inputs of one shape: the one following t is the timestep, the one following g the guidance
    (HunyuanVideo-style: 1000 * g)."""
    f = derive(_pair(mode="none", t_scale=0.001, guidance_factor=1000.0), {"guidance_scale": 6.0})
    assert f.cfg_mode == "distilled" and f.guidance_input == "guidance" and f.guidance_input_scale == 1000.0
    assert f.inputs["timestep"].role == "timestep" and f.inputs["guidance"].role == "guidance"
    assert f.timestep_scale == 0.001 and f.guidance_scale == 6.0


@pytest.mark.parametrize(("combine", "renorm"), [("cond + g * (cond - uncond)", False),
                                                ("uncond + g * (cond - uncond)", True)])
def test_cfg_combination_forms(combine: str, renorm: bool) -> None:
    """Krea 2's cond + g * (cond - uncond) and Lumina 2's / Nucleus-MoE's rescale to |cond| (last axis), told
    from the usual form at both recordings' scales, with the sign they apply after."""
    f = derive(_pair(mode="two-pass", combine=combine, renorm=renorm, sign=-1), {})
    assert (f.combine, f.renorm, f.sign) == (combine, "cond_l2_last_axis" if renorm else None, -1)


@pytest.mark.parametrize("mode", ["batched", "two-pass"])
def test_unconditional_zeros(mode: str) -> None:
    """An unconditional pass fed zeros (not the negative embeddings the call was given) is ``negative_fill`` 0;
    two-pass with the zeros call first: the conditional call is the one fed the argument."""
    f = derive(_pair(mode=mode, zeros=True), {})
    ctx = f.inputs["encoder_hidden_states"]
    assert (ctx.argument, ctx.negative_argument, ctx.negative_fill) == ("prompt_embeds", None, 0.0)
    assert f.cond_call == (1 if mode == "two-pass" else None)


def test_mask_extended_with_valid_positions() -> None:
    """Chroma's transformer mask: the call's text mask followed by one valid position per image token."""
    f = derive(_pair(mode="two-pass", mask=True), {})
    m = f.inputs["attention_mask"]
    assert (m.role, m.argument, m.negative_argument, m.append_valid) == (
        "attention_mask", "prompt_attention_mask", "negative_prompt_attention_mask", 5)


def test_conditional_row_first_and_cfg_on_some_channels() -> None:
    """Lumina-Next: the batched pair is [cond, uncond] and the combination covers its first channel only here (3 of
    4 in the pipeline), the rest being the conditional prediction."""
    f = derive(_pair(cond_first=True, channels=1, learned=True), {})
    assert (f.cond_first, f.cfg_channels, f.learned_sigma) == (True, 1, True)
    assert f.inputs["encoder_hidden_states"].argument == "prompt_embeds"


def test_per_sample_lists_are_the_batch() -> None:
    """Z-Image: the call takes prompt_embeds as a list of per-prompt tensors, the transformer its latent and text as
    lists of per-sample tensors (the latent with a frame axis of one) and returns a list: each list is its stack,
    and the latent input is the loop latent twice with the frame axis."""
    from rkpart.export.describe import nest_kwargs

    recs = _pair(cond_first=True)
    for r in recs:
        r.args["prompt_embeds"] = list(r.args["prompt_embeds"].unbind(0))
        for s in r.steps:
            (c,) = s.calls
            c.kwargs["hidden_states"] = list(c.kwargs["hidden_states"].unsqueeze(2).unbind(0))
            c.kwargs["encoder_hidden_states"] = list(c.kwargs["encoder_hidden_states"].unbind(0))
    f = derive(recs, {})
    assert (f.latent_input, f.cfg_mode, f.cond_first) == ("hidden_states", "batched", True)
    assert f.inputs["encoder_hidden_states"].argument == "prompt_embeds"
    assert {k: n.kind for k, n in f.nests.items()} == {"hidden_states": "stack", "encoder_hidden_states": "stack"}
    again = nest_kwargs({"hidden_states": torch.zeros(2, 3), "encoder_hidden_states": torch.ones(2, 4)}, f.nests)
    assert [tuple(x.shape) for x in again["hidden_states"]] == [(3,), (3,)]


def test_scheduler_stepped_on_the_doubled_pair_and_a_constant_unconditional_row() -> None:
    """DiT: the loop variable is the pair [x, x] (both halves identical at every step), class_labels is
    [label, 1000]: the loop is on x, the unconditional row is the fill 1000, the pair [cond, uncond]."""
    recs = _pair(cond_first=True)
    for k, r in enumerate(recs):
        r.args["class_labels"] = [3 + k]
        for s in r.steps:
            s.sample, s.model_output, s.prev_sample = (torch.cat([x, x]) for x in (s.sample, s.model_output,
                                                                                   s.prev_sample))
            s.calls[0].kwargs["class_labels"] = torch.tensor([3 + k, 1000])
    f = derive(recs, {})
    labels = f.inputs["class_labels"]
    assert (labels.role, labels.argument, labels.negative_fill) == ("class_labels", "class_labels", 1000.0)
    assert (f.cfg_mode, f.cond_first, f.call_batch) == ("batched", True, 2)


def test_reversed_timestep_and_negated_output() -> None:
    """Z-Image style: the model gets (1000 - t) / 1000 and the pipeline negates its output."""
    f = derive(_pair(t_scale=-0.001, t_offset=1.0, sign=-1), {})
    assert (f.timestep_scale, f.timestep_offset, f.sign) == (-0.001, 1.0, -1)


def test_learned_sigma_and_init_noise_sigma() -> None:
    f = derive(_pair(learned=True, init=2.0), {})
    assert f.learned_sigma and f.latent_init == "init_noise_sigma"


def test_constant_input_is_kept_as_a_value() -> None:
    ids = torch.arange(6.0).reshape(3, 2)
    f = derive(_pair(extra=lambda _i: ids), {})
    assert f.inputs["ids"].role == "position_ids" and (f.inputs["ids"].value == ids.numpy()).all()


def test_input_from_nowhere_is_refused() -> None:
    with pytest.raises(DescribeError, match="transformer input 'ids' is neither a call argument"):
        derive(_pair(extra=lambda i: torch.full((2,), float(i * i + 7))), {})


def test_unmatched_model_output_names_the_step() -> None:
    recs = _pair()
    recs[0].steps[0].model_output = recs[0].steps[0].model_output * 1.5  # a combination no candidate gives
    with pytest.raises(DescribeError, match=r"^step 1 of 2: no combination of the transformer output"):
        derive(recs, {})


def test_sigmas_rule_recognised_and_unknown_rule_refused() -> None:
    import numpy as np

    recs = [_recording(1, 2, 3.0, sigmas=list(np.linspace(1, 1 / 2, 2)), mu=0.7),
            _recording(2, 3, 5.5, sigmas=list(np.linspace(1, 1 / 3, 3)), mu=0.7)]
    f = derive(recs, {})
    assert (f.sigmas_rule, f.mu) == ("linspace(1, 1/n, n)", 0.7)
    recs = [_recording(1, 2, 3.0, sigmas=[0.9, 0.2]), _recording(2, 3, 5.5, sigmas=[0.9, 0.5, 0.2])]
    with pytest.raises(DescribeError, match="follow no rule rkpart knows"):
        derive(recs, {})


def test_mu_changing_with_the_step_count_is_refused() -> None:
    recs = [_recording(1, 2, 3.0, mu=0.5), _recording(2, 3, 5.5, mu=0.6)]
    with pytest.raises(DescribeError, match="mu passed to set_timesteps changes with the step count"):
        derive(recs, {})


def test_mu_rule_of_the_step_count() -> None:
    """Flux.2's mu depends on the step count: recorded as its rule and the image token count (here the 2 x 2
    positions of the loop latent), not as a number."""
    from rkpart.description import flux2_empirical_mu

    recs = [_recording(1, 2, 3.0, mu=flux2_empirical_mu(4, 2)), _recording(2, 3, 5.5, mu=flux2_empirical_mu(4, 3))]
    f = derive(recs, {})
    assert (f.mu, f.mu_rule, f.image_seq_len) == (None, "flux2_empirical", 4)


def test_latents_changed_before_the_loop_are_refused() -> None:
    recs = _pair()
    recs[1].args["latents"] = recs[1].args["latents"] + 1.0
    with pytest.raises(DescribeError, match="changes the given latents="):
        derive(recs, {})
