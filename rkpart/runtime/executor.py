"""Execute a plan stage by stage and compare it with the whole model."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.errors import SpecError, UserError, first_line
from rkpart.partitioner.plan import Plan, TensorInfo
from rkpart.runtime.base import Backend, Feeds
from rkpart.runtime.ort import OrtBackend, make_session
from rkpart.validation.metrics import Metrics, compare


def random_feeds(specs: Iterable[tuple[str, str | np.dtype, Sequence[int]]], seed: int = 0) -> Feeds:
    """Seeded arrays for ``(name, dtype, shape)``: floats ~ N(0, 1); integers in [0, 4); bools random.

    Small non-negative integers keep index-like inputs (labels, positions) in range.
    """
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for n, dtype, shape in specs:
        dt = np.dtype(dtype)
        if dt.kind == "f":
            feeds[n] = rng.standard_normal(tuple(shape)).astype(dt)
        elif dt.kind in "iu":
            feeds[n] = rng.integers(0, 4, size=tuple(shape)).astype(dt)
        elif dt.kind == "b":
            feeds[n] = rng.integers(0, 2, size=tuple(shape)).astype(bool)
        else:
            raise UserError(f"cannot make random input for {n!r} of type {dt}; pass --inputs")
    return feeds


def random_inputs(infos: Mapping[str, TensorInfo], names: tuple[str, ...], seed: int = 0) -> Feeds:
    """Seeded inputs for a plan's ``names`` (see :func:`random_feeds`)."""
    return random_feeds(((n, infos[n].dtype, infos[n].shape) for n in names), seed)


def load_inputs(path: str | Path, plan: Plan) -> Feeds:
    """Read model inputs from an ``.npz``; :class:`UserError` (one line) for anything unusable.

    Arrays are cast to the model's dtype only when that is value-preserving in kind
    (numbers to numbers); shapes must match exactly.  Pickled (object) arrays are refused.
    """
    import zipfile
    import zlib

    p = Path(path)
    if not p.is_file():
        raise UserError(f"inputs file {p} does not exist")
    try:
        z = np.load(p, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise UserError(f"inputs {p} is a single .npy array, not an .npz with one array per model input")
        with z:
            feeds = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        why = "it holds pickled (object) arrays" if "pickle" in str(e) else first_line(e)
        raise UserError(f"cannot read inputs {p}: not a usable .npz ({why})") from None
    for n in plan.inputs:
        if n not in feeds:
            raise UserError(f"inputs file {p} has no array {n!r} (model inputs: {', '.join(plan.inputs)})")
        info = plan.tensors[n]
        a = feeds[n]
        if not isinstance(a, np.ndarray):  # NpzFile returns raw bytes for members that are not .npy
            raise UserError(f"inputs file {p}: member {n!r} is not a .npy array")
        if tuple(a.shape) != info.shape:
            raise UserError(f"input {n!r}: shape {tuple(a.shape)} in {p}, model wants {info.shape}")
        want = np.dtype(info.dtype)
        if a.dtype.kind not in "biuf" or want.kind not in "biuf":
            raise UserError(f"input {n!r}: dtype {a.dtype} in {p} cannot be used as {want}")
        feeds[n] = a.astype(want)
    return feeds


def run_plan(
    plan: Plan,
    folder: Path,
    feeds: Feeds,
    *,
    backend: Backend | None = None,
    host: Backend | None = None,
    keep: bool = False,
    on_stage: Callable[[int, str, Feeds], None] | None = None,
) -> Feeds:
    """Run every stage in order; NPU stages on ``backend``, host stages on ``host`` (ORT).

    Returns the model outputs (every tensor with ``keep``).
    """
    backend = backend or OrtBackend()
    host = host or OrtBackend()
    env: dict[str, np.ndarray] = dict(feeds)
    for i, stage in enumerate(plan.stages):
        b = backend if stage.device in backend.devices and stage.device == "npu" else host
        r = b.runner(stage, folder)
        r.load()
        r.init()
        try:
            out = r.infer(env)
        finally:
            r.release()
        env.update(out)
        if on_stage is not None:
            on_stage(i, stage.id, out)
    if keep:
        return env
    missing = [o for o in plan.outputs if o not in env]
    if missing:
        raise SpecError(f"plan never produces model output {missing[0]!r}")
    return {o: env[o] for o in plan.outputs}


def run_model(model: str | Path, feeds: Feeds, outputs: tuple[str, ...] | None = None) -> Feeds:
    """The whole model under ONNX Runtime: the reference every plan is checked against."""
    sess = make_session(str(model))
    names = list(outputs) if outputs else [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def compare_outputs(actual: Feeds, reference: Feeds) -> dict[str, Metrics]:
    return {k: compare(actual[k], reference[k]) for k in reference}


def metrics_table(results: Mapping[str, Metrics]) -> list[dict[str, Any]]:
    return [{"tensor": k, **m.to_json()} for k, m in results.items()]
