"""The board's samplers (:mod:`rkpart.runtime.board_sampling`) against diffusers' real schedulers.

For every implemented class: the published configs of the sweep's pipelines at 1, 2, 3, 20 and
50 steps, and option variations at 3 and 20 (``scripts/check_samplers.py`` runs every step count
of every case): equal timesteps, equal sigmas (to the ulp torch's float32 ``sqrt`` is off by),
and a whole loop of a deterministic stand-in model ending at the same latent, with diffusers'
own noise where the sampler is stochastic (:mod:`tests.runtime.sampling_oracle`).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rkpart.runtime import board_sampling as bs
from tests.runtime.sampling_oracle import (
    PUBLISHED,
    VARIATIONS,
    Case,
    diffusers_loop,
    diffusers_scheduler,
    loop_error,
    max_rel,
    schedule_mismatches,
)

STEPS = (1, 2, 3, 20, 50)
MODULE = Path(bs.__file__)


def _ids(cases: tuple[Case, ...]) -> list[str]:
    return [c.name for c in cases]


@pytest.mark.export
def test_defaults_are_diffusers() -> None:
    """Each class's defaults are those of diffusers' ``__init__`` (a missing key takes them)."""
    import diffusers

    for name, defaults in bs.DEFAULTS.items():
        sig = inspect.signature(getattr(diffusers, name).__init__)
        theirs = {k: p.default for k, p in sig.parameters.items() if k != "self"}
        assert theirs == defaults, name
    assert set(bs.SCHEDULERS) == set(bs.DEFAULTS)


@pytest.mark.export
@pytest.mark.parametrize("case", PUBLISHED, ids=_ids(PUBLISHED))
def test_published_schedules_and_loops_equal_diffusers(case: Case) -> None:
    assert bs.unsupported(case.cls, case.config) == []
    for n in STEPS:
        assert schedule_mismatches(case, n) == [], n
        r = loop_error(case, n)
        assert r.ok(max_rel(case)), (n, r)


@pytest.mark.export
@pytest.mark.parametrize("case", VARIATIONS, ids=_ids(VARIATIONS))
def test_option_variations_equal_diffusers(case: Case) -> None:
    assert bs.unsupported(case.cls, case.config) == []
    ran = 0
    for n in (3, 20):
        assert schedule_mismatches(case, n) == [], n
        r = loop_error(case, n)
        # both_refused: diffusers fails on these steps too (squaredcos karras timesteps repeat at 20)
        assert r.ok(max_rel(case)), (n, r)
        ran += not r.both_refused
    assert ran


@pytest.mark.export
def test_every_published_class_and_option_is_exercised() -> None:
    """The grid reaches every implemented class and, within it, each option the docs say is reproduced."""
    cases = PUBLISHED + VARIATIONS
    assert {c.cls for c in cases} == set(bs.SCHEDULERS)
    keys = {(c.cls, k) for c in cases for k, v in c.config.items() if v != bs.DEFAULTS[c.cls].get(k, v)}
    for cls, key in [("FlowMatchEulerDiscreteScheduler", k) for k in (
            "shift", "use_dynamic_shifting", "shift_terminal", "invert_sigmas", "use_karras_sigmas",
            "use_exponential_sigmas", "time_shift_type", "stochastic_sampling")] + [
            ("DPMSolverMultistepScheduler", k) for k in (
            "solver_order", "algorithm_type", "prediction_type", "use_flow_sigmas", "flow_shift", "use_karras_sigmas",
            "use_exponential_sigmas", "use_lu_lambdas", "lower_order_final", "euler_at_final", "final_sigmas_type",
            "lambda_min_clipped", "timestep_spacing", "variance_type", "thresholding", "solver_type",
            "rescale_betas_zero_snr", "use_dynamic_shifting", "trained_betas", "beta_schedule")] + [
            ("DDIMScheduler", k) for k in ("prediction_type", "set_alpha_to_one", "steps_offset", "timestep_spacing",
                                           "rescale_betas_zero_snr", "clip_sample", "thresholding")] + [
            ("DDPMScheduler", k) for k in ("prediction_type", "variance_type", "beta_schedule", "timestep_spacing")] + [
            ("UniPCMultistepScheduler", k) for k in ("solver_order", "solver_type", "predict_x0", "disable_corrector",
                                                     "use_karras_sigmas", "use_exponential_sigmas", "use_flow_sigmas",
                                                     "use_dynamic_shifting", "shift_terminal", "final_sigmas_type")]:
        assert (cls, key) in keys, (cls, key)


# ---------------------------------------------------------------------------------------------
# the pieces: torch's arithmetic, rules, pipeline helpers


@pytest.mark.export
def test_torch_linspace_and_betas_are_bit_exact() -> None:
    import torch

    rng = np.random.default_rng(0)
    cases = [(0.0001, 0.02, 1000), (0.00085 ** 0.5, 0.012 ** 0.5, 1000), (1.0, 0.0, 51), (1.0, 1 / 7, 7), (3.0, 3.0, 1)]
    cases += [(float(a), float(b), int(n)) for a, b, n in zip(rng.uniform(-3, 3, 16), rng.uniform(-3, 3, 16),
                                                              rng.integers(1, 1200, 16), strict=True)]
    for a, b, n in cases:
        for np_dt, t_dt in ((np.float32, torch.float32), (np.float64, torch.float64)):
            ours = bs.torch_linspace(a, b, n, np_dt)
            assert ours.dtype == np_dt and np.array_equal(torch.linspace(a, b, n, dtype=t_dt).numpy(), ours), (a, b, n)
    # alphas_cumprod, the DDPM family's whole schedule, bit for bit
    for cls, cfg in [("DDIMScheduler", {}), ("DDIMScheduler", {"beta_schedule": "scaled_linear"}),
                     ("DDPMScheduler", {"beta_schedule": "squaredcos_cap_v2"}),
                     ("DDPMScheduler", {"beta_schedule": "laplace"}),
                     ("CogVideoXDDIMScheduler", {}), ("CogVideoXDDIMScheduler", {"beta_schedule": "linear"}),
                     ("DDIMScheduler", {"trained_betas": [0.001 * (i + 1) for i in range(100)],
                                        "num_train_timesteps": 100})]:
        d = diffusers_scheduler(Case("x", cls, cfg))
        m = bs.make_scheduler(cls, cfg)
        assert np.array_equal(d.alphas_cumprod.numpy(), m.alphas_cumprod), (cls, cfg)  # type: ignore[attr-defined]


@pytest.mark.export
def test_schedule_rules_are_the_pipelines_expressions() -> None:
    """Each named rule gives the array the pipeline computes, in the dtype it computes it."""
    import torch

    big = 1000
    for n in (1, 2, 3, 28, 50):
        expected = {
            "linspace(1, 1/n, n)": {"sigmas": np.linspace(1.0, 1 / n, n)},
            "torch.linspace(1, 1/n, n)": {"sigmas": np.array(torch.linspace(1.0, 1 / n, n).tolist(), np.float32)},
            "linspace(1, 0, n+1)[:-1]": {"sigmas": np.linspace(1.0, 0.0, n + 1)[:-1]},
            "torch.linspace(1, 0, n+1)[:-1]": {"sigmas": torch.linspace(1.0, 0.0, n + 1)[:-1].numpy()},
            "torch.linspace(0, 1, n, float64)": {"sigmas": torch.linspace(0, 1, n, dtype=torch.float64).numpy()},
            "timesteps=linspace(N, 1, n).int, sigmas=timesteps/N": {
                "timesteps": np.linspace(big, 1.0, n).astype(np.int64).astype(np.float32),
                "sigmas": np.linspace(big, 1.0, n).astype(np.int64).astype(np.float32) / big},
            "timesteps=linspace(N, 1, n+1)[:-1].int, sigmas=timesteps/N": {
                "timesteps": np.linspace(big, 1.0, n + 1)[:-1].astype(np.int64).astype(np.float32),
                "sigmas": np.linspace(big, 1.0, n + 1)[:-1].astype(np.int64).astype(np.float32) / big},
        }
        assert set(expected) == set(bs.SCHEDULE_RULES)
        for rule, want in expected.items():
            got = bs.schedule_arguments(rule, n, big)
            assert set(got) == set(want), rule
            for k, v in want.items():
                assert got[k].dtype == v.dtype and np.array_equal(got[k], v), (rule, n, k)
    assert np.array_equal(bs.named_sigmas("linspace(1, 1/n, n)", 4), np.linspace(1.0, 0.25, 4))
    with pytest.raises(bs.SamplerError, match=re.escape("unknown schedule rule 'linspace(1, 0, n)'")):
        bs.named_sigmas("linspace(1, 0, n)", 4)


def _flux_pipeline_functions() -> dict[str, Any]:
    """diffusers' own ``calculate_shift`` and ``retrieve_timesteps``, taken from pipeline_flux.py's
    source (importing the module needs transformers, which the test environment lacks)."""
    import ast

    import diffusers
    import torch

    path = Path(diffusers.__file__).parent / "pipelines" / "flux" / "pipeline_flux.py"
    tree = ast.parse(path.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("calculate_shift",
                                                                                   "retrieve_timesteps")]
    ns: dict[str, Any] = {"inspect": inspect, "np": np, "torch": torch, "Any": Any}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), ns)
    return ns


@pytest.mark.export
def test_calculate_shift_and_retrieve_timesteps_match_the_pipeline() -> None:
    ns = _flux_pipeline_functions()
    calculate_shift, retrieve_timesteps = ns["calculate_shift"], ns["retrieve_timesteps"]

    for seq in (256, 1024, 4096, 6400):
        assert bs.calculate_shift(seq) == calculate_shift(seq)
        assert bs.calculate_shift(seq, 1024, 4096, 0.95, 2.05) == calculate_shift(seq, 1024, 4096, 0.95, 2.05)
    flux = next(c for c in PUBLISHED if c.name == "flux")
    n, mu = 28, bs.calculate_shift(4096)
    d = diffusers_scheduler(flux)
    ts_d, n_d = retrieve_timesteps(d, n, "cpu", sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
    m = bs.make_scheduler(flux.cls, flux.config)
    ts_m, n_m = bs.retrieve_timesteps(m, n, rule="linspace(1, 1/n, n)", mu=mu)
    assert n_d == n_m == n and np.array_equal(ts_d.numpy(), ts_m) and np.array_equal(d.sigmas.numpy(), m.sigmas)
    # without a custom schedule, the scheduler's own spacing
    pix = next(c for c in PUBLISHED if c.name == "pixart")
    d, m = diffusers_scheduler(pix), bs.make_scheduler(pix.cls, pix.config)
    ts_d, _ = retrieve_timesteps(d, 20, "cpu")
    assert np.array_equal(ts_d.numpy(), bs.retrieve_timesteps(m, 20)[0])
    with pytest.raises(bs.SamplerError, match="does not take sigmas"):
        bs.retrieve_timesteps(m, 20, rule="linspace(1, 1/n, n)")


# ---------------------------------------------------------------------------------------------
# what is refused, and why


#: configs diffusers itself cannot run (it raises, or its loop ends in NaN/inf), each with the
#: options board_sampling names
BROKEN_IN_DIFFUSERS = [
    ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver"}, ['final_sigmas_type="zero"']),
    ("DPMSolverMultistepScheduler", {"algorithm_type": "deis"}, ['final_sigmas_type="zero"']),
    ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver", "final_sigmas_type": "sigma_min",
                                     "solver_order": 3}, ["solver_order=3"]),
    ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True, "use_exponential_sigmas": True},
     ["use_karras_sigmas=true", "use_exponential_sigmas=true"]),
    ("UniPCMultistepScheduler", {"solver_type": "bh1"}, ['solver_type="bh1"']),
    ("UniPCMultistepScheduler", {"predict_x0": False}, ["predict_x0=false"]),
    ("UniPCMultistepScheduler", {"lower_order_final": False}, ["lower_order_final=false"]),
    ("UniPCMultistepScheduler", {"shift_terminal": 0.1}, ["shift_terminal=0.1"]),
    ("DDPMScheduler", {"variance_type": "fixed_large_log"}, ['variance_type="fixed_large_log"']),
    ("EulerAncestralDiscreteScheduler", {"prediction_type": "sample"}, ['prediction_type="sample"']),
]

#: configs diffusers runs that board_sampling does not reproduce
NOT_REPRODUCED = [
    ("FlowMatchEulerDiscreteScheduler", {"use_beta_sigmas": True}, ["use_beta_sigmas=true"]),  # scipy
    ("DPMSolverMultistepScheduler", {"beta_schedule": "sigmoid"}, ['beta_schedule="sigmoid"']),
    ("DDPMScheduler", {"beta_schedule": "sigmoid"}, ['beta_schedule="sigmoid"']),  # torch's float32 sigmoid
    ("EulerDiscreteScheduler", {"interpolation_type": "log_linear"}, ['interpolation_type="log_linear"']),
    ("EulerDiscreteScheduler", {"timestep_type": "continuous", "prediction_type": "v_prediction"},
     ['timestep_type="continuous"']),
    ("FlowMatchEulerDiscreteScheduler", {"shift": "3.0", "num_train_timesteps": 1000.0},
     ['num_train_timesteps=1000.0', 'shift="3.0"']),  # JSON types diffusers would not check
    ("DDIMScheduler", {"clip_sample": 1}, ["clip_sample=1"]),
    ("DDIMScheduler", {"trained_betas": [0.01, 0.02]}, ['trained_betas="2 values"']),
    ("FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 10 ** 9}, ["num_train_timesteps=1000000000"]),
    ("HeliosScheduler", {}, ["HeliosScheduler"]),
    ("PNDMScheduler", {"skip_prk_steps": True}, ["PNDMScheduler"]),
]


@pytest.mark.parametrize(("cls", "config", "names"), BROKEN_IN_DIFFUSERS + NOT_REPRODUCED,
                         ids=[f"{c}-{'-'.join(n)}" for c, _, n in BROKEN_IN_DIFFUSERS + NOT_REPRODUCED])
def test_refused_options_are_named(cls: str, config: dict[str, object], names: list[str]) -> None:
    assert sorted(bs.unsupported(cls, config)) == sorted(names)
    with pytest.raises(bs.SamplerError) as e:
        bs.make_scheduler(cls, config)
    assert all(n in str(e.value) for n in names)
    assert "\n" not in str(e.value)


@pytest.mark.export
@pytest.mark.parametrize(("cls", "config", "names"), BROKEN_IN_DIFFUSERS,
                         ids=[f"{c}-{'-'.join(n)}" for c, _, n in BROKEN_IN_DIFFUSERS])
def test_refused_as_broken_are_broken_in_diffusers(cls: str, config: dict[str, object], names: list[str]) -> None:
    case = Case("broken", cls, config)
    try:
        out = diffusers_loop(case, 5)
    except (ValueError, NotImplementedError, IndexError, UnboundLocalError, ImportError):
        return
    assert not np.isfinite(out).all()


def test_config_keys_of_other_classes_and_saved_defaults() -> None:
    """As ``from_config``: unknown keys are ignored (``sigma_min`` is read as an attribute where the
    class reads one), ``_use_default_values`` keys take the class default."""
    cfg = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0", "shift": 3.0,
           "beta_start": 0.00085, "skip_prk_steps": True, "_use_default_values": ["shift"]}
    assert bs.unsupported("FlowMatchEulerDiscreteScheduler", cfg) == []
    m = bs.make_scheduler("FlowMatchEulerDiscreteScheduler", cfg)
    assert m.config["shift"] == 1.0 and m.config.extra == {"beta_start": 0.00085, "skip_prk_steps": True}
    a = bs.make_scheduler("FlowMatchEulerDiscreteScheduler", {"use_karras_sigmas": True})
    b = bs.make_scheduler("FlowMatchEulerDiscreteScheduler", {"use_karras_sigmas": True, "sigma_max": 80.0})
    a.set_timesteps(4)
    b.set_timesteps(4)
    assert a.sigmas is not None and b.sigmas is not None and b.sigmas[0] == np.float32(80.0) != a.sigmas[0]


def test_calls_diffusers_refuses_are_refused() -> None:
    m = bs.make_scheduler("FlowMatchEulerDiscreteScheduler", {"use_dynamic_shifting": True})
    with pytest.raises(bs.SamplerError, match="mu"):
        m.set_timesteps(10)
    m.set_timesteps(3, mu=0.5)
    x = np.zeros((1, 4, 2, 2), np.float32)
    with pytest.raises(bs.SamplerError, match="not an integer index"):
        m.step(x, 0, x)
    with pytest.raises(bs.SamplerError, match="is not one of the scheduler's timesteps"):
        m.step(x, np.float32(12.5), x)
    for t in m.timesteps:
        x = m.step(x, t, x)
    with pytest.raises(bs.SamplerError, match="step 4 of 3 timesteps"):
        m.step(x, m.timesteps[-1], x)
    d = bs.make_scheduler("DDIMScheduler", {})
    with pytest.raises(bs.SamplerError, match="set_timesteps before step"):
        d.step(x, 999, x)
    with pytest.raises(bs.SamplerError, match=r"num_inference_steps must be in \[1, 1000\]"):
        d.set_timesteps(1001)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(bs.SamplerError, match="num_inference_steps must be an integer"):
            d.set_timesteps(bad)  # type: ignore[arg-type]
    with pytest.raises(bs.SamplerError, match="sigmas must be a 1-D array of finite numbers"):
        m.set_timesteps(None, sigmas=[1.0, float("nan")], mu=0.5)
    with pytest.raises(bs.SamplerError, match="mu must be a finite number"):
        m.set_timesteps(3, mu=float("inf"))
    d.set_timesteps(4)
    with pytest.raises(bs.SamplerError, match=r"model_output \(1, 3, 2, 2\) does not fit sample \(1, 4, 2, 2\)"):
        d.step(x[:, :3], d.timesteps[0], x)


def test_stochastic_steps_take_their_noise_from_the_caller() -> None:
    x = np.ones((1, 4, 2, 2), np.float32)
    for cls, cfg in [("DDPMScheduler", {}), ("EulerAncestralDiscreteScheduler", {}),
                     ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++"}),
                     ("CogVideoXDPMScheduler", {}), ("FlowMatchEulerDiscreteScheduler", {"stochastic_sampling": True})]:
        m = bs.make_scheduler(cls, cfg)
        m.set_timesteps(4)
        t = m.timesteps[0]
        with pytest.raises(bs.SamplerError, match="pass generator_noise"):
            m.step(x, t, m.scale_model_input(x, t))
        m.set_timesteps(4)
        with pytest.raises(bs.SamplerError, match=r"returned shape \(3,\)"):
            m.step(x, t, m.scale_model_input(x, t), generator_noise=lambda s: np.zeros(3))
        calls: list[tuple[int, ...]] = []

        def noise(shape: tuple[int, ...], calls: list[tuple[int, ...]] = calls) -> np.ndarray:
            calls.append(shape)
            return np.zeros(shape)

        m.set_timesteps(4)
        for t in m.timesteps:
            m.step(x, t, m.scale_model_input(x, t), generator_noise=noise)
        assert calls and all(s == x.shape for s in calls), cls
    # a deterministic sampler never asks
    m = bs.make_scheduler("DDIMScheduler", {})
    m.set_timesteps(4)
    for t in m.timesteps:
        m.step(x, t, x, generator_noise=lambda s: pytest.fail("DDIM drew noise"))


# ---------------------------------------------------------------------------------------------
# the oracle catches a sampler that drifts


def _first_order_only(self: bs.DPMSolverMultistepScheduler, x: np.ndarray, noise: object) -> np.ndarray:
    m = self.model_outputs[-1]
    assert m is not None
    return self._first_order(m, x, None)


def _mu_one_percent_off(kind: str, mu: float, t: np.ndarray) -> np.ndarray:
    return _F32_TIME_SHIFT(kind, mu * 1.01, t)


_F32_TIME_SHIFT = bs._f32_time_shift


#: code-level drifts the oracle must catch: (case, steps, module or class, attribute, replacement)
DRIFTS = [
    ("pixart", 20, bs.DPMSolverMultistepScheduler, "_second_order", _first_order_only),
    ("flux", 20, bs, "_f32_time_shift", _mu_one_percent_off),
    ("wan", 20, bs.UniPCMultistepScheduler, "_correct", lambda self, model_t, last, this, order: this),
    # a step 1e-4 too long: the size of drift the 1e-5 tolerance is there to see
    ("sd3", 20, bs.FlowMatchEulerDiscreteScheduler, "_step",
     lambda self, mo, t, x, gen: _FM_STEP(self, mo * np.float32(1 + 1e-4), t, x, gen)),
]
_FM_STEP = bs.FlowMatchEulerDiscreteScheduler._step


@pytest.mark.export
@pytest.mark.parametrize(("case_name", "n", "owner", "attr", "patch"), DRIFTS,
                         ids=["dpm-no-second-order", "flux-mu-1%", "unipc-no-corrector", "flow-step-1e-4"])
def test_a_drifting_sampler_fails_the_oracle(case_name: str, n: int, owner: object, attr: str, patch: object,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in PUBLISHED if c.name == case_name)
    assert loop_error(case, n).ok()
    monkeypatch.setattr(owner, attr, patch)
    r = loop_error(case, n)
    assert not r.ok(), r


@pytest.mark.export
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shift=st.floats(0.2, 12.0), mu=st.floats(-1.0, 3.0), n=st.integers(1, 60),
       dynamic=st.booleans(), rule=st.sampled_from([None, "linspace(1, 1/n, n)", "torch.linspace(1, 0, n+1)[:-1]"]))
def test_flow_match_any_shift(shift: float, mu: float, n: int, dynamic: bool, rule: str | None) -> None:
    case = Case("fm", "FlowMatchEulerDiscreteScheduler", {"shift": shift, "use_dynamic_shifting": dynamic},
                rule=rule, mu=mu if dynamic else None)
    assert schedule_mismatches(case, n) == []
    r = loop_error(case, n)
    assert r.ok(), r


# ---------------------------------------------------------------------------------------------
# a leaf: NumPy and the standard library only


def test_imports_only_numpy_and_the_standard_library() -> None:
    """Every import statement, at any depth (the subprocess test below runs it with the rest blocked)."""
    import ast

    nodes = [n for n in ast.walk(ast.parse(MODULE.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
    top = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in nodes)  # no relative import either
    assert top - set(sys.stdlib_module_names) == {"numpy"}, top


@pytest.mark.slow
def test_runs_with_torch_scipy_and_rkpart_blocked(tmp_path: Path) -> None:
    """Copied alone as the bundle does, in a process where torch, scipy and rkpart cannot import."""
    (tmp_path / "sampling.py").write_bytes(MODULE.read_bytes())
    script = textwrap.dedent("""
        import importlib.abc, sys
        sys.path.insert(0, ".")
        BLOCKED = {"torch", "scipy", "rkpart", "diffusers", "onnxruntime"}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {name}")
        sys.meta_path.insert(0, Block())
        before = set(sys.modules)
        import sampling
        import numpy as np
        new = {m.split(".")[0] for m in set(sys.modules) - before}
        assert new - set(sys.stdlib_module_names) <= {"numpy", "sampling"}, new
        rng = np.random.default_rng(0)
        for cls, cfg in [("DPMSolverMultistepScheduler", {"use_flow_sigmas": True, "flow_shift": 3.0,
                                                          "prediction_type": "flow_prediction"}),
                         ("DDPMScheduler", {"prediction_type": "v_prediction"}),
                         ("UniPCMultistepScheduler", {}), ("CogVideoXDDIMScheduler", {})]:
            s = sampling.make_scheduler(cls, cfg)
            s.set_timesteps(6)
            x = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
            for t in s.timesteps:
                x = s.step(0.5 * x, t, x, generator_noise=lambda shape: rng.standard_normal(shape))
            assert x.dtype == np.float32 and np.isfinite(x).all(), cls
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={"PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_same_config_and_noise_give_the_same_bytes() -> None:
    """The runner's outputs are byte-identical for identical inputs: so is every sampler's loop."""
    def run(cls: str, cfg: dict[str, object]) -> bytes:
        rng = np.random.default_rng(3)
        s = bs.make_scheduler(cls, cfg)
        s.set_timesteps(7)
        x = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
        for t in s.timesteps:
            x = s.step(np.tanh(s.scale_model_input(x, t)), t, x, generator_noise=rng.standard_normal)
        return x.tobytes()

    for cls in bs.SCHEDULERS:
        assert run(cls, {}) == run(cls, {}), cls
