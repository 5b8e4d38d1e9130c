"""A build that fails in an optimiser rule its log names is rebuilt with that rule off.

rknn-toolkit2 ends a failed rule with "You can add disable_rules=['fuse_x'] in rknn.config() to
temporarily disable the error rule!" (``disable_rules`` is read from ``RKNN.config``'s ``**kwargs``).
``rkpart compile`` rebuilds such a stage with the named rules off, again while each new failure
names another.  Measured on BRIA-FIBO 2's perceiver cross-attention (its query a constant): 2.5.0's
two SDPA fusion rules fail in turn; with both off the stage builds with 0 CPU layers.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from rkpart.compile.compile import named_rules
from rkpart.compile.worker_main import StepError, _config_kwargs

HINT = ("W You can add disable_rules=['fuse_matmul_softmax_matmul_to_sdpa'] in rknn.config() to temporarily "
        "disable the error rule!")


@pytest.mark.parametrize(("text", "want"), [
    (HINT, ("fuse_matmul_softmax_matmul_to_sdpa",)),
    (HINT + "\n" + HINT, ("fuse_matmul_softmax_matmul_to_sdpa",)),  # the toolkit prints it twice
    ('add disable_rules=["a_rule", \'b_rule\'] in', ("a_rule", "b_rule")),
    ("\x1b[1;33mW\x1b[0m You can add disable_rules=['swap_reshape_transpose_v2'] in rknn.config()",
     ("swap_reshape_transpose_v2",)),
    ("ValueError: Can not reshape from [1, 8] to [2, 4]", ()),  # no hint: nothing to retry with
    ("disable_rules=[]", ()),
])
def test_named_rules(text: str, want: tuple[str, ...]) -> None:
    assert named_rules(text) == want


class _Config:
    """The shape of ``RKNN.config``: named options, then ``**kwargs`` (2.x)."""

    def config(self, target_platform: str | None = None, float_dtype: str = "float16", **kwargs: Any) -> int:
        return 0


class _ClosedConfig:
    def config(self, target_platform: str | None = None) -> int:
        return 0


def test_worker_passes_disable_rules_and_still_refuses_misspelt_options() -> None:
    assert _config_kwargs(_Config(), {"disable_rules": ["x"], "float_dtype": "float16"}) == {
        "disable_rules": ["x"], "float_dtype": "float16"}
    with pytest.raises(StepError, match="'float_dtyp' is not accepted"):
        _config_kwargs(_Config(), {"float_dtyp": "float16"})
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(_Config.config).parameters.values())
    with pytest.raises(StepError, match="'disable_rules' is not accepted"):  # a toolkit without **kwargs
        _config_kwargs(_ClosedConfig(), {"disable_rules": ["x"]})


@pytest.mark.toolkit
@pytest.mark.export
def test_constant_query_cross_attention_builds_with_the_named_rules_off(tmp_path: Path) -> None:
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from rkpart.pipeline import partition
    from tests.models.diffusers_families import cached_export
    from tests.toolkits import get_toolkit

    folder = tmp_path / "plan"
    plan = partition(cached_export("bria_fibo2", "torchscript"), folder, "split", toolkit="2.5.0")
    (xattn,) = [s.id for s in plan.npu_stages if s.id == "b02.xattn_txt"]  # the perceiver's, query constant
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.5.0"), "rk3588", {}, stages=(xattn,),
                                                           cache=False, learn=False))
    (o,) = [o for o in rep.outcomes if o.stage_id == xattn]
    assert o.status == "built", [f.message for f in o.failures]
    assert o.artifact is not None and o.artifact.cpu_ops == ()
    logs = sorted(p.name for p in (folder / "rknn" / "logs").glob(f"{xattn}.2.5.0*.log"))
    assert logs == [f"{xattn}.2.5.0.log", f"{xattn}.2.5.0.rules-off-1.log", f"{xattn}.2.5.0.rules-off-2.log"], logs
    last = (folder / "rknn" / "logs" / logs[-1]).read_text(errors="replace")
    assert "disable_rules" not in last  # the third build failed in no rule
