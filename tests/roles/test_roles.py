"""Roles and what each input is fed (:mod:`rkpart.roles`), on plans written by hand: the shape
rule refuses ties, flags and the pipeline description name the roles, masks and id grids never
get noise, ``--embeds`` maps call arguments to inputs.  No torch, no toolkit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.description import PipelineDescription, load_description
from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan, TensorInfo
from rkpart.roles import BY_DESCRIPTION, BY_FLAGS, BY_SHAPE, RoleFlags, load_embeds, loop_inputs, pass_inputs
from rkpart.roles import resolve_roles as resolve
from tests.description.docs import base_doc, edited, flux_guidance_inputs, flux_ids, write


def plan_of(inputs: dict[str, tuple[str, tuple[int, ...]]], output: tuple[int, ...], name: str = "sample") -> Plan:
    tensors = {n: TensorInfo(n, dt, shape) for n, (dt, shape) in inputs.items()}
    tensors[name] = TensorInfo(name, "float32", output)
    return Plan(model={}, strategy={"name": "x"}, inputs=tuple(inputs), outputs=(name,), tensors=tensors, stages=())


FLUX = {n: (s["dtype"], tuple(s["shape"])) for n, s in flux_guidance_inputs().items()}


@pytest.fixture
def flux() -> Plan:
    return plan_of(FLUX, (1, 16, 16))


@pytest.fixture
def described(tmp_path: Path) -> PipelineDescription:
    return load_description(write(tmp_path, base_doc(flux_guidance_inputs()), flux_ids()))


def test_shape_rule_refuses_the_timestep_guidance_tie_in_one_line(flux: Plan) -> None:
    no_ids = plan_of({n: v for n, v in FLUX.items() if "ids" not in n}, (1, 16, 16))
    for plan in (flux, no_ids):
        with pytest.raises(SpecError) as e:
            resolve(plan)
        msg = str(e.value)
        assert "\n" not in msg and e.value.exit_code == 5
        assert "2 inputs fit the timestep" in msg and "timestep, guidance" in msg
        assert "--timestep-input NAME [--guidance-input NAME]" in msg and "rkpart partition --pipeline FILE" in msg


def test_flags_break_the_tie_and_name_the_guidance(flux: Plan) -> None:
    said: list[str] = []
    r = resolve(flux, flags=RoleFlags(timestep="timestep", guidance="guidance"), progress=said.append)
    assert (r.latent, r.timestep, r.guidance, r.source) == ("hidden_states", "timestep", "guidance", BY_SHAPE)
    assert "latent not named by flags" in said[0] and "guessed" in said[0]
    assert r.roles["img_ids"] == r.roles["txt_ids"] == "position_ids"  # by name: never a candidate, never drawn
    assert r.context == ("encoder_hidden_states", "pooled_projections")
    r = resolve(flux, flags=RoleFlags("hidden_states", "timestep", "guidance"))
    assert r.source == BY_FLAGS
    with pytest.raises(UserError, match="'t' is not an input of the model"):
        resolve(flux, flags=RoleFlags(timestep="t"))
    with pytest.raises(UserError, match="must name different inputs"):
        resolve(flux, flags=RoleFlags(timestep="guidance", guidance="guidance"))


def test_shape_rule_guesses_only_without_a_tie_and_says_so() -> None:
    plan = plan_of({"x": ("float32", (1, 4, 8, 8)), "t": ("int64", (1,)), "ctx": ("float32", (1, 6, 24)),
                    "encoder_attention_mask": ("int64", (1, 6))}, (1, 4, 8, 8))
    said: list[str] = []
    r = resolve(plan, progress=said.append)
    assert (r.latent, r.timestep, r.source) == ("x", "t", BY_SHAPE)
    assert r.roles["encoder_attention_mask"] == "attention_mask" and r.context == ("ctx",)
    assert said and said[0].startswith("roles guessed from shapes")
    twins = plan_of({"a": ("float32", (1, 4)), "b": ("float32", (1, 4)), "t": ("float32", (1,))}, (1, 4))
    with pytest.raises(SpecError, match=r"2 inputs fit the latent .*: a, b; rkpart does not guess"):
        resolve(twins)
    assert resolve(twins, flags=RoleFlags(latent="a")).context == ("b",)


def test_the_description_names_every_role_and_flags_must_agree(flux: Plan, described: PipelineDescription) -> None:
    r = resolve(flux, described)
    assert r.source == BY_DESCRIPTION
    assert (r.latent, r.timestep, r.guidance) == ("hidden_states", "timestep", "guidance")
    assert r.roles["img_ids"] == "image_ids" and r.roles["txt_ids"] == "text_ids"
    assert resolve(flux, described, RoleFlags(timestep="timestep")).timestep == "timestep"
    with pytest.raises(UserError) as e:
        resolve(flux, described, RoleFlags(timestep="guidance"))
    assert str(e.value) == ("--timestep-input guidance: the plan's pipeline.json says timestep is timestep; "
                            "drop the flag")


def test_distilled_loop_feeds_guidance_timestep_and_the_pipelines_ids(flux: Plan,
                                                                      described: PipelineDescription) -> None:
    lp = loop_inputs(flux, resolve(flux, described), seed=0)
    assert lp.mode == "distilled" and lp.kinds(True) == ("cond",)  # no unconditional pass, whatever --cfg says
    x = lp.x0
    (feed,) = lp.feeds(x, 0.75, lp.guidance_scale, True)
    assert set(feed) == set(FLUX)
    assert feed["guidance"].tolist() == [3.5] and feed["guidance"].dtype == np.float32
    assert feed["timestep"].tolist() == [0.75]  # FluxPipeline: timestep / 1000, sigma * 1000 / 1000
    assert np.array_equal(feed["img_ids"], flux_ids()["img_ids"]) and not feed["txt_ids"].any()
    assert feed["encoder_hidden_states"].std() > 0.5  # drawn conditioning, the only noise besides the latent
    v = lp.velocity([{"sample": np.ones((1, 16, 16), np.float32)}], 3.5, True)
    assert np.array_equal(v, np.ones((1, 16, 16), np.float32))  # one pass: no CFG combine


def test_guidance_input_scale_and_timestep_offset(flux: Plan, tmp_path: Path) -> None:
    doc = base_doc(flux_guidance_inputs(), timestep={"scale": -0.001, "offset": 1.0, "reverse": True})
    doc["cfg"]["guidance_input_scale"] = 1000.0
    d = load_description(write(tmp_path, doc, flux_ids()))
    lp = loop_inputs(flux, resolve(flux, d), seed=0)
    (feed,) = lp.feeds(lp.x0, 0.25, 6.0, False)
    assert feed["guidance"].tolist() == [6000.0] and feed["timestep"].tolist() == [0.75]


def test_loop_refuses_a_feature_it_does_not_implement(tmp_path: Path) -> None:
    """A description whose CFG combination the loop does not compute (Krea 2's) is refused in one line, naming the
    feature, instead of running the usual combination."""
    inputs = {"x": {"role": "latent", "shape": [1, 4, 8], "dtype": "float32"},
              "t": {"role": "timestep", "shape": [1], "dtype": "float32"},
              "ctx": {"role": "text_embeddings", "shape": [1, 6, 24], "dtype": "float32",
                      "argument": "prompt_embeds", "negative_argument": "negative_prompt_embeds"}}
    doc = base_doc(inputs, cfg={"mode": "two-pass", "guidance_scale": 4.5, "guidance_input": None,
                                "combine": "cond + g * (cond - uncond)"},
                   latent={"shape": [1, 4, 8], "dtype": "float32", "init": "identity", "packing": None, "channels": 4})
    plan = plan_of({n: (s["dtype"], tuple(s["shape"])) for n, s in inputs.items()}, (1, 4, 8))
    r = resolve(plan, load_description(write(tmp_path, doc)))
    with pytest.raises(SpecError, match=r"uses cfg\.combine=cond \+ g \* \(cond - uncond\), which rkpart's "
                                        "denoising loop does not implement"):
        loop_inputs(plan, r)


def test_batched_cfg_feeds_the_uncond_cond_pair_and_splits_the_output(tmp_path: Path) -> None:
    inputs = {"x": {"role": "latent", "shape": [2, 4, 8], "dtype": "float32"},
              "t": {"role": "timestep", "shape": [2], "dtype": "float32"},
              "ctx": {"role": "text_embeddings", "shape": [2, 6, 24], "dtype": "float32",
                      "argument": "prompt_embeds", "negative_argument": "negative_prompt_embeds"},
              "mask": {"role": "attention_mask", "shape": [2, 6], "dtype": "int64",
                       "argument": "prompt_attention_mask", "negative_argument": "negative_prompt_attention_mask"}}
    doc = base_doc(inputs, batch=2, cfg={"mode": "batched", "guidance_scale": 4.5, "guidance_input": None,
                                         "combine": "uncond + g * (cond - uncond)"},
                   latent={"shape": [1, 4, 8], "dtype": "float32", "init": "identity", "packing": None,
                           "channels": 4})
    d = load_description(write(tmp_path, doc))
    plan = plan_of({n: (s["dtype"], tuple(s["shape"])) for n, s in inputs.items()}, (2, 4, 8))
    r = resolve(plan, d)
    pos, neg = np.full((1, 6, 24), 2.0, np.float32), np.full((1, 6, 24), -1.0, np.float32)
    mask = np.array([[1, 1, 1, 1, 0, 0]])
    np.savez(tmp_path / "e.npz", prompt_embeds=pos, negative_prompt_embeds=neg, prompt_attention_mask=mask,
             negative_prompt_attention_mask=np.ones((1, 6), np.int64))
    lp = loop_inputs(plan, r, seed=0, embeds=load_embeds(tmp_path / "e.npz", r, plan, cfg=True))
    assert lp.x0.shape == (1, 4, 8) and lp.kinds(True) == ("pair",)
    (feed,) = lp.feeds(lp.x0, 0.5, 4.5, True)
    assert np.array_equal(feed["ctx"], np.concatenate([neg, pos]))  # [negative, positive] rows
    assert feed["mask"].tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]] and feed["mask"].dtype == np.int64
    assert np.array_equal(feed["x"], np.concatenate([lp.x0, lp.x0])) and feed["t"].tolist() == [0.5, 0.5]
    out = np.concatenate([np.zeros((1, 4, 8)), np.ones((1, 4, 8))]).astype(np.float32)
    assert np.array_equal(lp.velocity([{"sample": out}], 4.5, True), np.full((1, 4, 8), 4.5, np.float32))
    # no --embeds: the mask is all-valid in both rows, never noise
    (feed,) = loop_inputs(plan, r, seed=0).feeds(lp.x0, 0.5, 4.5, True)
    assert np.array_equal(feed["mask"], np.ones((2, 6), np.int64)) and not feed["ctx"][0].any()


def test_no_noise_for_masks_ids_or_integers_without_a_description() -> None:
    plan = plan_of({"x": ("float32", (1, 16, 16)), "t": ("float32", (1,)), "ctx": ("float32", (1, 6, 24)),
                    "prompt_mask": ("bool", (1, 6)), "labels": ("int64", (1, 2))}, (1, 16, 16))
    lp = loop_inputs(plan, resolve(plan), seed=3)
    for feed in lp.feeds(lp.x0, 1.0, 4.0, True):
        assert feed["prompt_mask"].dtype == bool and feed["prompt_mask"].all()
        assert feed["labels"].dtype == np.int64 and not feed["labels"].any()
    ids = plan_of({"x": ("float32", (1, 16, 16)), "t": ("float32", (1,)), "img_ids": ("float32", (16, 3))},
                  (1, 16, 16))
    with pytest.raises(SpecError, match="input 'img_ids' is an id grid / RoPE table: rkpart does not make up"):
        loop_inputs(ids, resolve(ids))
    assert not pass_inputs(ids, None, 0)["img_ids"].any()  # one pass (run, profile): zeros, not noise


def embeds_case(tmp_path: Path, described: PipelineDescription, flux: Plan, **arrays: Any) -> str:
    np.savez(tmp_path / "e.npz", **arrays)
    with pytest.raises(UserError) as e:
        load_embeds(tmp_path / "e.npz", resolve(flux, described), flux, cfg=False)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_embeds_map_call_arguments_and_refuse_what_does_not_fit(tmp_path: Path, flux: Plan,
                                                                described: PipelineDescription) -> None:
    good = {"prompt_embeds": np.ones((1, 6, 24), np.float32), "pooled_prompt_embeds": np.ones((1, 16), np.float16)}
    np.savez(tmp_path / "ok.npz", **good, unrelated=np.zeros(3))
    cond, uncond = load_embeds(tmp_path / "ok.npz", resolve(flux, described), flux, cfg=False)
    assert set(cond) == {"encoder_hidden_states", "pooled_projections"} and uncond == {}
    assert cond["pooled_projections"].dtype == np.float32  # float16 to the input's float32
    lp = loop_inputs(flux, resolve(flux, described), embeds=(cond, uncond))
    (feed,) = lp.feeds(lp.x0, 1.0, 3.5, False)
    assert np.array_equal(feed["encoder_hidden_states"], good["prompt_embeds"])
    assert "has no 'pooled_prompt_embeds' (input 'pooled_projections', cond pass; its keys: prompt_embeds)" in \
        embeds_case(tmp_path, described, flux, prompt_embeds=good["prompt_embeds"])
    assert "'prompt_embeds' is [1, 5, 24]; input 'encoder_hidden_states' takes [1, 6, 24]" in \
        embeds_case(tmp_path, described, flux, prompt_embeds=np.ones((1, 5, 24), np.float32),
                    pooled_prompt_embeds=good["pooled_prompt_embeds"])
    assert "'prompt_embeds' is int64; input 'encoder_hidden_states' takes float32" in \
        embeds_case(tmp_path, described, flux, prompt_embeds=np.ones((1, 6, 24), np.int64),
                    pooled_prompt_embeds=good["pooled_prompt_embeds"])
    with pytest.raises(UserError, match=r"only the plan's pipeline\.json maps to model inputs; this plan has none"):
        load_embeds(tmp_path / "ok.npz", resolve(flux, flags=RoleFlags(timestep="timestep", guidance="guidance")),
                    flux, cfg=False)


def test_two_pass_cfg_needs_the_negative_arguments(tmp_path: Path, flux: Plan) -> None:
    ins = flux_guidance_inputs()
    ins.pop("guidance")
    ins["encoder_hidden_states"]["negative_argument"] = "negative_prompt_embeds"
    doc = edited(base_doc(ins), "cfg", {"mode": "two-pass", "guidance_scale": 5.0, "guidance_input": None,
                                      "combine": "uncond + g * (cond - uncond)"})
    d = load_description(write(tmp_path, doc, flux_ids()))
    plan = plan_of({n: v for n, v in FLUX.items() if n != "guidance"}, (1, 16, 16))
    r = resolve(plan, d)
    np.savez(tmp_path / "e.npz", prompt_embeds=np.ones((1, 6, 24), np.float32),
             pooled_prompt_embeds=np.ones((1, 16), np.float32))
    with pytest.raises(UserError, match="has no 'negative_prompt_embeds' \\(input 'encoder_hidden_states', uncond"):
        load_embeds(tmp_path / "e.npz", r, plan, cfg=True)
    cond, uncond = load_embeds(tmp_path / "e.npz", r, plan, cfg=False)
    lp = loop_inputs(plan, r, embeds=(cond, uncond))
    assert lp.kinds(True) == ("cond", "uncond") and lp.guidance_scale == 5.0
    c, u = lp.feeds(lp.x0, 1.0, 5.0, True)
    # the negative prompt's embeddings are not given and the pass is not run without --cfg: zeros
    assert c["encoder_hidden_states"].all() and not u["encoder_hidden_states"].any()
    assert np.array_equal(u["img_ids"], flux_ids()["img_ids"])
