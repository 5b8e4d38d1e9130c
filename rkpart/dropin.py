"""Drop-in replacement for an RKNN export script's ``config`` / ``load_onnx`` / ``build`` / ``export_rknn``.

An export script usually reads::

    rknn = RKNN()
    rknn.config(target_platform="rk3588", optimization_level=3)
    rknn.load_onnx(model="model.onnx")
    rknn.build(do_quantization=False)
    rknn.export_rknn("model.rknn")

With rkpart the same ``config`` keywords go to one call, which partitions the model, builds
every NPU part with that config in the isolated toolkit environment (rknn-toolkit2 is never
imported here), and returns the plan and one ``.rknn`` per NPU stage::

    result = rkpart.build("model.onnx", "build/", config={"target_platform": "rk3588",
                                                          "optimization_level": 3})
    result.artifacts  # {"seg00": Path("build/rknn/....rknn"), ...}

See ``docs/examples/export_with_rkpart.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart.errors import DiscoveryError, ToolkitError, UserError
from rkpart.pipeline import (
    LoadedModel,
    PartitionConfig,
    get_strategy,
    load,
    propose,
    write_plan,
)
from rkpart.plan.plan import Plan
from rkpart.plan.write import prepare_out
from rkpart.targets import DEFAULT_TARGET
from rkpart.types import JsonMap, JsonObject

#: ``RKNN.config`` options that describe the *model inputs*; a partitioned build's stage
#: inputs are intermediate tensors, so only identity values can be passed on
_INPUT_OPTIONS = {"mean_values": 0.0, "std_values": 1.0}


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build` made.

    Attributes
    ----------
    plan
        The plan, with an artifact (or failures) recorded on every NPU stage.
    plan_dir
        Folder of ``plan.json``, the stage ONNX files and ``rknn/`` (the built models).
    artifacts
        NPU stage id -> ``.rknn`` file, in execution order.
    strategy
        Strategy used, and why (``"generic (no AdaLN blocks found)"``).
    failed
        NPU stage id -> last build failure message (empty unless ``check=False``).
    """

    plan: Plan
    plan_dir: Path
    artifacts: dict[str, Path]
    strategy: str
    failed: dict[str, str] = field(default_factory=dict)


def choose_strategy(model: str | os.PathLike[str] | LoadedModel,
                    input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[str, str]:
    """The default strategy for ``model`` and the reason: ``split`` for DiT blocks, else ``generic``.

    DiT blocks are blocks with an AdaLN-modulated branch (a normalisation scaled and shifted
    by a timestep-dependent value): their AdaLN is what crashes some toolkit versions when
    compiled inside a stage, and ``split`` keeps it on the host.  Any other model is cut by
    memory budget.  A :class:`~rkpart.pipeline.LoadedModel` is used as it is (its discovery
    is kept for the partition that follows); a path is loaded with ``input_shapes``.
    """
    loaded = model if isinstance(model, LoadedModel) else load(model, input_shapes)
    try:
        disc = loaded.discovery()
    except DiscoveryError:
        return "generic", "no transformer blocks found"
    if any(r.adaln == "adaln" for b in disc.blocks for r in b.regions):
        return "split", f"{len(disc.blocks)} DiT blocks with AdaLN found"
    return "generic", f"{len(disc.blocks)} blocks found, none with AdaLN"


def _check_config(config: JsonMap) -> None:
    for key, identity in _INPUT_OPTIONS.items():
        v = config.get(key)
        if v is None:
            continue
        flat = list(_flatten(v))
        if any(float(x) != identity for x in flat):
            raise UserError(
                f"config {key}={v!r} normalises the model inputs, but the stages of a partitioned build "
                f"take intermediate tensors; fold the normalisation into the ONNX model and leave {key} unset"
            )


def _flatten(v: object) -> Any:
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from _flatten(x)
    else:
        yield v


def build(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: JsonMap | None = None,
    *,
    strategy: str | None = None,
    toolkit: str = "2.3.0",
    budget_mib: float | None = None,
    do_quantization: bool = False,
    dataset: str | os.PathLike[str] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    force: bool = False,
    jobs: int = 1,
    timeout: float | None = None,
    fallback_toolkit: str | None = None,
    toolkits_dir: str | os.PathLike[str] | None = None,
    check: bool = True,
    progress: Callable[[str], None] | None = None,
    **strategy_options: Any,
) -> BuildResult:
    """Partition ``model`` and build every NPU stage with ``RKNN.config(**config)``.

    Parameters
    ----------
    model
        The ONNX file an export script would give ``RKNN.load_onnx(model=...)``.
    out
        Plan folder to create (replaced only with ``force``).
    config
        The keyword arguments of the script's ``RKNN.config(...)`` call;
        ``target_platform`` (default ``rk3588``) is the build target.  ``mean_values`` /
        ``std_values`` must be unset or identity (stage inputs are intermediate tensors).
    strategy
        ``split``, ``fused``, ``generic``, ``custom`` or a plugin; default
        :func:`choose_strategy` (``split`` for DiT blocks, else ``generic``).
    toolkit
        rknn-toolkit2 version, installed with ``rkpart toolkit install VERSION``.
    budget_mib
        Memory budget per stage for ``generic`` (and ``auto``) in MiB.
    do_quantization, dataset
        As for ``RKNN.build``: ``True`` builds every NPU stage as int8 (w8a8; ``quantized_algorithm``
        from ``config``), calibrated on ``dataset``, the model's own dataset file (one line per
        sample, the model inputs' ``.npy`` paths, relative to the file).  rkpart runs those samples
        through the plan (``rkpart calibrate --inputs``) to get each stage's own inputs; the
        calibration folder is ``out/rknn/calibration/source``.
    input_shapes
        Static shapes for inputs with symbolic dimensions (``input_size_list``).
    jobs, timeout, fallback_toolkit, toolkits_dir
        Passed to :func:`rkpart.compile_plan`.
    check
        Raise :class:`~rkpart.errors.ToolkitError` if any stage failed to build; with
        ``False`` the failures are returned in :attr:`BuildResult.failed`.
    progress
        Called with one line of text per step.
    **strategy_options
        Further strategy options (``adaln="npu"``, ``blocks_per_stage=2``, ...).

    Returns
    -------
    BuildResult

    Raises
    ------
    UserError
        Bad model, option or config (one-line message); :class:`ToolkitError` when a stage
        fails to build (with ``check``) or the toolkit is not installed.

    Examples
    --------
    >>> import rkpart
    >>> result = rkpart.build("vit.onnx", "build/", config={"target_platform": "rk3588"},
    ...                       budget_mib=256)  # doctest: +SKIP
    >>> sorted(result.artifacts)  # doctest: +SKIP
    ['seg00', 'seg01']
    """
    from rkpart.compile.compile import compile_plan

    say = progress or (lambda _m: None)
    cfg = dict(config or {})
    algorithm = str(cfg.pop("quantized_algorithm", "normal"))
    qdtype = cfg.pop("quantized_dtype", "w8a8")
    if do_quantization and dataset is None:
        raise UserError("do_quantization=True needs dataset= (the model's calibration dataset file, as for "
                        "RKNN.build)")
    if qdtype != "w8a8":
        raise UserError(f"quantized_dtype {qdtype!r}: rkpart builds w8a8 only (the one quantized type of rk3588)")
    _check_config(cfg)
    target = str(cfg.pop("target_platform", None) or DEFAULT_TARGET)
    out = Path(out)
    strat = None if strategy is None else get_strategy(strategy)
    # before loading: a model of any size is not read for an output that cannot be written
    prepare_out(Path(os.path.abspath(out)), force, Path(model))

    # one loaded graph (and one discovery) for choosing the strategy, proposing and writing
    loaded = load(model, input_shapes, say)
    if strat is None:
        name, why = choose_strategy(loaded)
        say(f"strategy {name}: {why}")
        label = f"{name} ({why})"
        strat = get_strategy(name)
    else:
        label = strat.name
    options = dict(strategy_options)
    if budget_mib is not None:
        options["budget_mib"] = budget_mib

    how = PartitionConfig(options=options, force=force, target=target, toolkit=toolkit, progress=say)
    plan = write_plan(loaded, propose(loaded, strat, how), out, how)
    quant: JsonObject = {}
    if do_quantization and dataset is not None:
        from rkpart.profile.calibrate import dataset_feeds, write_calibration

        calib = out / "rknn" / "calibration" / "source"
        write_calibration(plan, out, calib, inputs=dataset_feeds(Path(dataset), plan), force=True,
                          progress=say)
        quant = {"precision": "int8", "calibration": calib, "quantized_algorithm": algorithm}
    say(f"building {len(plan.npu_stages)} NPU stage(s) with rknn-toolkit2 {toolkit} for {target}")
    plan = compile_plan(plan, out, toolkit, target, config=cfg, jobs=jobs, timeout=timeout,
                        fallback_toolkit=fallback_toolkit, progress=say, toolkits_dir=toolkits_dir, **quant)

    artifacts: dict[str, Path] = {}
    failed: dict[str, str] = {}
    for s in plan.npu_stages:
        a = s.artifact("rknn")
        if a is not None:
            artifacts[s.id] = out / a.file
        else:
            failed[s.id] = s.failures[-1].message if s.failures else "no artifact"
    if failed and check:
        first = next(iter(failed.items()))
        raise ToolkitError(
            f"{len(failed)} of {len(plan.npu_stages)} NPU stage(s) failed to build with rknn-toolkit2 {toolkit}; "
            f"first: {first[0]}: {first[1]} (failures recorded in {out / 'plan.json'})"
        )
    return BuildResult(plan=plan, plan_dir=out, artifacts=artifacts, strategy=label, failed=failed)


__all__ = ["BuildResult", "build", "choose_strategy"]
