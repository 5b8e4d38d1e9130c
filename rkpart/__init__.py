"""rkpart: partition ONNX models (Diffusion Transformers first) into stages for Rockchip NPUs.

The supported API (``docs/api.md``)::

    import rkpart
    mg = rkpart.load_model("model.onnx")               # validated, statically shaped op graph
    disc = rkpart.discover(mg)                         # blocks and regions (recognisers included)
    plan = rkpart.partition("model.onnx", "build/", strategy="split")
    plan = rkpart.compile_plan(plan, "build/", toolkit="2.3.0", target="rk3588")
    outs = rkpart.run_plan(plan, Path("build/"), feeds)
    result = rkpart.build("model.onnx", "build/", config={"target_platform": "rk3588"})

Everything is imported on first use, so ``import rkpart`` loads neither onnx nor torch nor
rknn-toolkit2.  (``compile_plan``/``profile_plan`` are not called ``compile``/``profile``:
those names are the subpackages that implement them, and ``compile`` is a builtin.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> "module:attribute" candidates (the first that imports wins)
_LAZY: dict[str, tuple[str, ...]] = {
    # pipeline
    "load_model": ("rkpart.ir:load_model",),
    "discover": ("rkpart.discovery.recognizers:discover",),
    "partition": ("rkpart.pipeline:partition",),
    "compile_plan": ("rkpart.compile.compile:compile_plan",),
    "run_plan": ("rkpart.runtime.executor:run_plan",),
    "profile_plan": ("rkpart.profile.lifecycle:profile_plan",),
    "ProfileOptions": ("rkpart.profile.lifecycle:ProfileOptions",),
    "fit": ("rkpart.cost_model.calibration:fit_profiles",),
    "select": ("rkpart.auto:select",),
    "build": ("rkpart.dropin:build",),
    # values
    "load_plan": ("rkpart.plan.plan:load_plan",),
    "Plan": ("rkpart.plan.plan:Plan",),
    "Stage": ("rkpart.plan.plan:Stage",),
    "ModelGraph": ("rkpart.ir:ModelGraph",),
    "Discovery": ("rkpart.discovery.structure:Discovery",),
    "BuildResult": ("rkpart.dropin:BuildResult",),
    "get_backend": ("rkpart.runtime:get_backend",),
    # extending
    "Strategy": ("rkpart.grouping.strategies.base:Strategy",),
    "GroupBuilder": ("rkpart.grouping.strategies.base:GroupBuilder",),
    "Partition": ("rkpart.grouping.groups:Partition",),
    "Group": ("rkpart.grouping.groups:Group",),
    "Recognizer": ("rkpart.discovery.recognizers:Recognizer",),
    "ScopeRecognizer": ("rkpart.discovery.recognizers:ScopeRecognizer",),
    # errors
    "RkpartError": ("rkpart.errors:RkpartError",),
    "UserError": ("rkpart.errors:UserError",),
}

# the supported surface (docs/api.md); tests check it names exactly what _LAZY resolves
__all__ = [
    "BuildResult",
    "Discovery",
    "Group",
    "GroupBuilder",
    "ModelGraph",
    "Partition",
    "Plan",
    "ProfileOptions",
    "Recognizer",
    "RkpartError",
    "ScopeRecognizer",
    "Stage",
    "Strategy",
    "UserError",
    "__version__",
    "build",
    "compile_plan",
    "discover",
    "fit",
    "get_backend",
    "load_model",
    "load_plan",
    "partition",
    "profile_plan",
    "run_plan",
    "select",
]

if TYPE_CHECKING:  # static types for what __getattr__ returns
    from rkpart.auto import select
    from rkpart.compile.compile import compile_plan
    from rkpart.discovery.recognizers import Recognizer, ScopeRecognizer, discover
    from rkpart.discovery.structure import Discovery
    from rkpart.dropin import BuildResult, build
    from rkpart.errors import RkpartError, UserError
    from rkpart.grouping.groups import Group, Partition
    from rkpart.grouping.strategies.base import GroupBuilder, Strategy
    from rkpart.ir import ModelGraph, load_model
    from rkpart.pipeline import partition
    from rkpart.plan.plan import Plan, Stage, load_plan
    from rkpart.profile.lifecycle import ProfileOptions, profile_plan
    from rkpart.runtime import get_backend
    from rkpart.runtime.executor import run_plan


def __getattr__(name: str) -> Any:
    targets = _LAZY.get(name)
    if targets is None:
        raise AttributeError(f"module 'rkpart' has no attribute {name!r}")
    errors = []
    for target in targets:
        mod_name, _, attr = target.partition(":")
        try:
            value = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            errors.append(f"{target}: {e}")
            continue
        globals()[name] = value  # later lookups skip __getattr__
        return value
    # a piece of the API this installation lacks fails when it is used, not on import
    return _unavailable(name, "; ".join(errors))


def _unavailable(name: str, why: str) -> Any:
    def missing(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"rkpart.{name} is not available in this installation ({why})")

    missing.__name__ = missing.__qualname__ = name
    missing.__doc__ = f"Unavailable: {why}"
    return missing


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
