"""Every built-in strategy declares a frozen options type; none takes ``**options``."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from rkpart.errors import UserError
from rkpart.grouping.strategies.fused import FusedOptions
from rkpart.grouping.strategies.split import SplitOptions
from rkpart.pipeline import BUILTIN, PartitionConfig


@pytest.mark.parametrize("cls", BUILTIN, ids=lambda c: c.name)
def test_builtin_strategies_take_one_frozen_options_object(cls: type) -> None:
    opts_type = cls.Options
    assert dataclasses.is_dataclass(opts_type) and opts_type.__dataclass_params__.frozen  # type: ignore[attr-defined]
    params = inspect.signature(cls.propose).parameters.values()
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    assert callable(getattr(opts_type, "from_mapping", None))


def test_options_are_built_and_checked_with_the_same_messages() -> None:
    assert SplitOptions.from_mapping({"adaln": "npu"}) == SplitOptions(adaln="npu")
    assert FusedOptions.from_mapping({"blocks_per_stage": 2}).blocks_per_stage == 2
    with pytest.raises(UserError, match=r"option adaln='gpu' is not one of host, npu"):
        SplitOptions.from_mapping({"adaln": "gpu"})
    with pytest.raises(UserError, match="blocks_per_stage must be >= 1, got 0"):
        FusedOptions.from_mapping({"blocks_per_stage": 0})


def test_partition_config_refuses_a_callable_option() -> None:
    with pytest.raises(TypeError, match="'report' is a callable"):
        PartitionConfig(options={"report": print})
