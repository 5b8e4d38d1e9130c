"""``pipeline.json``: what a diffusers pipeline does around its transformer (docs/pipeline-json.md).

``rkpart export`` writes it; every other command reads it to know which model input is the
latent, the timestep, the guidance, the conditioning, a mask or an id grid, instead of guessing
from shapes.  This module loads and checks it and needs neither torch nor diffusers: the
standard library, NumPy and jsonschema.

* :func:`load_description` reads ``pipeline.json`` (a bounded regular file), validates it
  against its JSON Schema (``rkpart/data/pipeline.schema.json``, a copy of
  ``docs/pipeline.schema.json``), then checks what a schema cannot say: one latent, at most one
  timestep and guidance, ``cfg.guidance_input`` names the guidance input, every ``value`` is in
  the ``values`` ``.npz`` with the input's shape and dtype.
* :func:`check_against` refuses a description that does not match the model's inputs (names,
  shapes, dtypes) and output.

Every problem is a :class:`~rkpart.errors.SpecError` (one line, exit 5).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rkpart.errors import SpecError
from rkpart.readers import FileKind

FORMAT = "rkpart-pipeline"
VERSION = 1
#: the file name ``rkpart export`` writes and ``rkpart partition`` looks for beside the model
FILENAME = "pipeline.json"
#: ``pipeline.json`` is a few KiB (the scheduler's config is the largest part); more is no description
MAX_BYTES = 4 << 20

#: what a transformer input can be (docs/pipeline-json.md, ``inputs.<name>.role``)
ROLES = ("latent", "timestep", "guidance", "text_embeddings", "pooled_embeddings", "attention_mask", "image_ids",
         "text_ids", "position_ids", "rope", "class_labels", "image_latents", "other")
#: roles whose value the pipeline computes, never a sample: no command draws noise for them
FIXED_ROLES = frozenset({"attention_mask", "image_ids", "text_ids", "position_ids", "rope"})
#: roles a command may draw seeded noise for when ``--embeds`` does not give them
EMBEDDING_ROLES = frozenset({"text_embeddings", "pooled_embeddings"})
CFG_MODES = ("batched", "two-pass", "distilled", "none")
#: ``cfg.combine``: the CFG combination of the conditional and unconditional predictions at scale ``g``
STANDARD_COMBINE = "uncond + g * (cond - uncond)"
COMBINES = (STANDARD_COMBINE, "cond + g * (cond - uncond)")
#: ``cfg.renorm``: a rescale of the combination (added within version 1; null: none)
RENORMS = ("cond_l2_last_axis",)

#: what a description may use beyond version 1 as first published (docs/pipeline-json.md, "Features"), by the
#: name :func:`features` gives it; a reader (the board runner, ``rkpart bundle``) refuses a description that
#: uses a feature it does not implement instead of running another loop than the pipeline's
FEATURES: dict[str, str] = {
    "cfg.combine=cond + g * (cond - uncond)": "the CFG combination is cond + g * (cond - uncond) (Krea 2)",
    "cfg.renorm=cond_l2_last_axis": "the CFG combination x is rescaled to x * |cond| / |x|, L2 norms over the last "
                                    "axis of the transformer output (Lumina 2, Nucleus-MoE)",
    "cfg.batch_order=cond,uncond": "the batched pair's rows are [cond, uncond] (Lumina-Next)",
    "cfg.channels": "the CFG combination applies to the first cfg.channels output channels, the rest are cond's "
                    "(Lumina-Next)",
    "inputs.negative_fill": "an input's unconditional pass feeds its shape filled with one number (zeros: "
                            "CogView3-Plus; DiT's null class 1000), not a call argument",
    "scheduler.set_timesteps.mu_rule=flux2_empirical": "mu is Flux.2's rule of the image token count and the "
                                                       "step count",
    "latent.init=tokens": "the loop latent is the given latents (B, C, *positions) as row-major tokens "
                          "(B, prod(positions), C) (Flux.2)",
    "image.num_frames": "a video pipeline: vae_decoder.onnx returns (B, 3, F, H, W) frames",
    "inputs.append_valid": "an input is its argument extended with N valid positions (ones) on the last axis "
                           "(Chroma's mask: the image tokens)",
}
PREDICTIONS = ("flow", "epsilon", "v_prediction", "sample")


@dataclass(frozen=True)
class InputDesc:
    """One transformer input: its role, static shape and dtype (as in the ONNX graph), the call
    arguments of the conditional and unconditional pass it comes from, and the key of its
    constant value in the ``values`` ``.npz``."""

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    argument: str | None = None
    negative_argument: str | None = None
    value: str | None = None
    #: the unconditional pass feeds zeros of the input's shape instead of ``negative_argument`` (added within v1)
    negative_fill: float | None = None
    #: the argument is extended with this many valid positions (ones) on its last axis (added within v1)
    append_valid: int = 0


@dataclass(frozen=True)
class OutputDesc:
    name: str
    prediction: str
    learned_sigma: bool = False
    sign: int = 1
    channels_axis: int = 1


@dataclass(frozen=True)
class TimestepDesc:
    """The model's timestep input is ``scale * t + offset`` (``t``: ``scheduler.timesteps[i]``)."""

    scale: float = 1.0
    offset: float = 0.0
    reverse: bool = False

    def model_value(self, t: float) -> float:
        return self.scale * t + self.offset


#: ``scheduler.set_timesteps.mu_rule``: ``mu`` as a rule of the image token count and the step count (added
#: within version 1; docs/pipeline-json.md gives each formula)
MU_RULES = ("flux2_empirical",)


def flux2_empirical_mu(image_seq_len: int, n: int) -> float:
    """``mu_rule: flux2_empirical`` (Flux2Pipeline's ``compute_empirical_mu``) for ``n`` steps."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200, m_10 = a2 * image_seq_len + b2, a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return float(a * n + (m_200 - 200.0 * a))


@dataclass(frozen=True)
class SchedulerDesc:
    class_name: str
    config: Mapping[str, Any] = field(default_factory=dict, compare=False)
    sigmas: str | None = None
    mu: float | None = None
    #: the rule of the ``timesteps`` the pipeline passes to ``set_timesteps`` beside its sigmas (CogView4)
    timesteps: str | None = None
    #: ``mu`` as a rule of ``image_seq_len`` and the step count (:data:`MU_RULES`), when ``mu`` is null
    mu_rule: str | None = None
    image_seq_len: int | None = None

    def mu_for(self, n: int) -> float | None:
        """The ``mu`` to pass to ``set_timesteps`` for ``n`` steps (``None``: pass none)."""
        if self.mu_rule is None:
            return self.mu
        assert self.mu_rule == "flux2_empirical" and self.image_seq_len is not None
        return flux2_empirical_mu(self.image_seq_len, n)


@dataclass(frozen=True)
class CfgDesc:
    """``mode``: ``batched``, ``two-pass``, ``distilled`` or ``none``.  Under ``distilled`` the
    guidance input holds ``guidance_input_scale * g`` (Flux 1, HunyuanVideo 1000)."""

    mode: str
    guidance_scale: float | None = None
    guidance_input: str | None = None
    combine: str | None = None
    guidance_input_scale: float = 1.0
    #: the call argument that is ``g`` (``guidance_scale``); ``None`` under ``none``
    scale_argument: str | None = None
    #: a rescale of the combination (:data:`RENORMS`), or ``None``
    renorm: str | None = None
    #: ``batched``: the row order of the pair (``"uncond,cond"``, diffusers' usual, or ``"cond,uncond"``)
    batch_order: str = "uncond,cond"
    #: the combination applies to the first ``channels`` output channels only (``None``: all)
    channels: int | None = None


@dataclass(frozen=True)
class LatentDesc:
    shape: tuple[int, ...]
    dtype: str
    init: str = "identity"
    packing: str | None = None
    channels: int = 0


@dataclass(frozen=True)
class VaeDesc:
    class_name: str
    file: str
    scaling_factor: float | None
    shift_factor: float | None
    latent_channels: int
    image_shape: tuple[int, ...]


@dataclass(frozen=True)
class TransformerDesc:
    class_name: str
    file: str
    dtype: str
    exporter: str
    patches: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageDesc:
    height: int
    width: int
    text_len: int | None
    batch: int
    #: a video pipeline's frames per call (added within version 1; ``None``: an image pipeline)
    num_frames: int | None = None


@dataclass(frozen=True)
class PipelineDescription:
    """A validated ``pipeline.json`` (see the module doc); ``values`` are the constant input
    values its ``values`` ``.npz`` holds, by key; ``sha256`` is that of the file's bytes."""

    pipeline_class: str
    diffusers: str | None
    transformer: TransformerDesc
    image: ImageDesc
    inputs: tuple[InputDesc, ...]
    output: OutputDesc
    timestep: TimestepDesc
    scheduler: SchedulerDesc
    cfg: CfgDesc
    latent: LatentDesc
    vae: VaeDesc | None
    values_file: str | None = None
    values: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    path: Path | None = field(default=None, compare=False)
    sha256: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def input(self, name: str) -> InputDesc:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)

    def with_role(self, *roles: str) -> tuple[InputDesc, ...]:
        """The inputs with any of ``roles``, in the description's order."""
        return tuple(i for i in self.inputs if i.role in roles)

    def role_input(self, role: str) -> str | None:
        """The name of the one input with ``role`` (latent, timestep, guidance), or ``None``."""
        got = self.with_role(role)
        return got[0].name if got else None

    def value_of(self, name: str) -> np.ndarray | None:
        """The constant value of input ``name`` (its ``value`` key in the ``.npz``), or ``None``."""
        key = self.input(name).value
        return None if key is None else self.values[key]


# -- loading -------------------------------------------------------------------------------------
@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of ``pipeline.json`` (``rkpart/data/pipeline.schema.json``)."""
    return dict(json.loads(resources.files("rkpart").joinpath("data/pipeline.schema.json").read_text()))


@cache
def _validator() -> Any:
    import jsonschema

    s = schema()
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    return cls(s)


def _where(path: Sequence[Any]) -> str:
    return "".join(f"[{p!r}]" if isinstance(p, str) and not p.isidentifier() else
                   (f".{p}" if isinstance(p, str) else f"[{p}]") for p in path).lstrip(".") or "the top level"


def load_description(path: str | os.PathLike[str], *, values: bool = True) -> PipelineDescription:
    """Read and check the ``pipeline.json`` at ``path`` (see the module doc).

    ``values``: also read the ``values`` ``.npz`` beside it and check every ``value`` against it.

    Raises
    ------
    SpecError
        Not a regular file, over :data:`MAX_BYTES`, not JSON, not valid against the schema, or
        inconsistent (one line naming the field).
    """
    p = Path(path)
    data = DESCRIPTION_KIND.read(p)  # rkpart.readers: a regular file, bounded, never a FIFO's endless wait
    doc = _parse(data, p)
    return parse_description(doc, p.parent, values=values, name=str(p), sha256=hashlib.sha256(data).hexdigest(),
                             path=p)


def _parse(data: bytes, p: Path) -> Any:
    doc = DESCRIPTION_KIND.parse(data, str(p))
    _finite(doc, str(p))
    return doc


def _finite(doc: Any, where: str) -> None:
    from rkpart.io import bad_number

    bad = bad_number(doc)
    if bad is not None:
        raise SpecError(f"pipeline description {where}: {bad[0] or 'a value'} is {bad[1]}, not a finite number")


def _check_doc(doc: Any, where: str) -> None:
    """The whole check of a parsed ``pipeline.json`` at ``where`` (its values ``.npz`` beside it)."""
    _finite(doc, where)
    parse_description(doc, Path(where).parent, name=where, path=Path(where))


#: ``pipeline.json`` (``rkpart export`` writes it beside the model; ``partition`` copies it into the plan)
DESCRIPTION_KIND = FileKind("pipeline description", "json", MAX_BYTES, SpecError, check=_check_doc,
                            doc="`pipeline.json` beside a model (`partition`, `export`) and in a plan "
                                "(`drift`, `calibrate`, `tune`, `bundle`)")


def parse_description(doc: Any, folder: str | os.PathLike[str] | None, *, values: bool = True,
                      name: str = FILENAME, sha256: str = "", path: Path | None = None) -> PipelineDescription:
    """A parsed ``pipeline.json`` document checked and typed; ``folder`` holds its ``values``
    ``.npz`` (read when ``values``).  ``rkpart export`` checks what it writes with this."""
    what = f"pipeline description {name}"
    if isinstance(doc, Mapping) and doc.get("format") == FORMAT and doc.get("version") != VERSION:
        raise SpecError(f"{what} is version {doc.get('version')!r}; this rkpart reads version {VERSION}")
    if isinstance(doc, Mapping) and "format" in doc and doc.get("format") != FORMAT:
        raise SpecError(f"{what} is not an rkpart pipeline description (format {str(doc.get('format'))[:40]!r}, "
                        f"expected {FORMAT!r})")
    import jsonschema

    # best_match descends into anyOf/oneOf: "'../x' does not match '^[^/]+$'", not "not valid under any"
    e = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if e is not None:
        raise SpecError(f"{what}: {_where(e.absolute_path)}: {e.message[:200]}")
    d = _typed(doc)
    _check(d, what)
    if values and d.values_file is not None:
        if folder is None:
            raise SpecError(f"{what} names values {d.values_file!r} but no folder to read them from")
        d = _with_values(d, Path(folder), what)
    elif values and any(i.value is not None for i in d.inputs):
        i = next(i for i in d.inputs if i.value is not None)
        raise SpecError(f"{what}: input {i.name!r} has value {i.value!r} but 'values' names no .npz")
    return PipelineDescription(**{**d.__dict__, "sha256": sha256, "path": path})


def _typed(doc: Mapping[str, Any]) -> PipelineDescription:
    t, im, o, ts, s, c, lat, v = (doc[k] for k in ("transformer", "image", "output", "timestep", "scheduler", "cfg",
                                                    "latent", "vae"))
    inputs = tuple(InputDesc(n, i["role"], tuple(i["shape"]), i["dtype"], i["argument"], i["negative_argument"],
                             i["value"], i.get("negative_fill"), int(i.get("append_valid", 0)))
                   for n, i in doc["inputs"].items())
    return PipelineDescription(
        pipeline_class=doc["pipeline"]["class"], diffusers=doc["pipeline"]["diffusers"],
        transformer=TransformerDesc(t["class"], t["file"], t["dtype"], t["exporter"], tuple(t["patches"])),
        image=ImageDesc(im["height"], im["width"], im["text_len"], im["batch"], im.get("num_frames")),
        inputs=inputs,
        output=OutputDesc(o["name"], o["prediction"], o["learned_sigma"], o["sign"], o["channels_axis"]),
        timestep=TimestepDesc(float(ts["scale"]), float(ts["offset"]), bool(ts.get("reverse", False))),
        scheduler=SchedulerDesc(s["class"], dict(s["config"]), s["set_timesteps"]["sigmas"],
                                None if s["set_timesteps"]["mu"] is None else float(s["set_timesteps"]["mu"]),
                                s["set_timesteps"].get("timesteps"), s["set_timesteps"].get("mu_rule"),
                                s["set_timesteps"].get("image_seq_len")),
        cfg=CfgDesc(c["mode"], None if c["guidance_scale"] is None else float(c["guidance_scale"]),
                    c["guidance_input"], c["combine"], float(c.get("guidance_input_scale", 1.0)),
                    c.get("scale_argument"), c.get("renorm"), c.get("batch_order", "uncond,cond"), c.get("channels")),
        latent=LatentDesc(tuple(lat["shape"]), lat["dtype"], lat["init"], lat["packing"], lat["channels"]),
        vae=None if v is None else VaeDesc(v["class"], v["file"], v["scaling_factor"], v["shift_factor"],
                                           v["latent_channels"], tuple(v["image_shape"])),
        values_file=doc["values"])


def _check(d: PipelineDescription, what: str) -> None:
    """What the schema cannot say."""
    for role in ("latent", "timestep", "guidance"):
        got = d.with_role(role)
        if len(got) > 1:
            raise SpecError(f"{what}: {len(got)} inputs have role {role!r} ({', '.join(i.name for i in got)}); "
                            "at most one may")
    if not d.with_role("latent"):
        raise SpecError(f"{what}: no input has role 'latent'")
    if d.output.name in d.names:
        raise SpecError(f"{what}: output {d.output.name!r} is also an input")
    g = d.cfg.guidance_input
    if d.cfg.mode == "distilled":
        if g is None:
            raise SpecError(f"{what}: cfg.mode 'distilled' needs cfg.guidance_input (the input guidance is fed to)")
        if g not in d.names or d.input(g).role != "guidance":
            raise SpecError(f"{what}: cfg.guidance_input {g!r} is not an input with role 'guidance'")
        if d.cfg.guidance_scale is None:
            raise SpecError(f"{what}: cfg.mode 'distilled' needs cfg.guidance_scale")
    elif g is not None:
        raise SpecError(f"{what}: cfg.guidance_input {g!r} is set but cfg.mode is {d.cfg.mode!r}, not 'distilled'")
    sc = d.scheduler
    if sc.mu_rule is not None and (sc.mu is not None or sc.image_seq_len is None):
        raise SpecError(f"{what}: scheduler.set_timesteps.mu_rule needs mu null and image_seq_len set")
    if d.cfg.mode in ("batched", "two-pass") and d.cfg.combine is None:
        raise SpecError(f"{what}: cfg.mode {d.cfg.mode!r} needs cfg.combine")
    if d.cfg.mode not in ("batched", "two-pass") and (d.cfg.combine is not None or d.cfg.renorm is not None
                                                      or d.cfg.channels is not None):
        raise SpecError(f"{what}: cfg.combine / renorm / channels are set but cfg.mode {d.cfg.mode!r} combines no "
                        "passes")
    if d.cfg.batch_order != "uncond,cond" and d.cfg.mode != "batched":
        raise SpecError(f"{what}: cfg.batch_order {d.cfg.batch_order!r} needs cfg.mode 'batched'")
    if d.cfg.mode == "batched" and d.image.batch != 2:
        raise SpecError(f"{what}: cfg.mode 'batched' needs image.batch 2, not {d.image.batch}")
    for i in d.inputs:
        if i.negative_fill is not None and (i.argument is None or i.negative_argument is not None):
            raise SpecError(f"{what}: input {i.name!r} has negative_fill but "
                            f"{'no argument' if i.argument is None else 'also a negative_argument'}")
        if i.append_valid and (i.argument is None or not i.shape or i.shape[-1] <= i.append_valid):
            why = "has no argument" if i.argument is None else f"its last axis holds only {i.shape[-1:]}"
            raise SpecError(f"{what}: input {i.name!r} appends {i.append_valid} valid positions but {why}")
        if i.role in ("latent", "timestep", "guidance") and i.value is not None:
            raise SpecError(f"{what}: input {i.name!r} ({i.role}) changes every step; it cannot have a constant value")


def _with_values(d: PipelineDescription, folder: Path, what: str) -> PipelineDescription:
    from rkpart.io import confined_file
    from rkpart.readers import read_npz

    assert d.values_file is not None
    f = confined_file(folder, d.values_file, what=f"{what}: values", error=SpecError, within="folder of pipeline.json")
    keys = sorted({i.value for i in d.inputs if i.value is not None})
    arrays = read_npz(f, what=f"{what}: values", names=keys, error=SpecError)
    for i in d.inputs:
        if i.value is None:
            continue
        a = arrays.get(i.value)
        if a is None:
            raise SpecError(f"{what}: input {i.name!r} takes value {i.value!r}, which {d.values_file} does not hold")
        if tuple(a.shape) != i.shape or a.dtype != np.dtype(i.dtype):
            raise SpecError(f"{what}: value {i.value!r} of input {i.name!r} is {a.dtype} {list(a.shape)} in "
                            f"{d.values_file}; the input is {i.dtype} {list(i.shape)}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise SpecError(f"{what}: value {i.value!r} of input {i.name!r} holds NaN/Inf")
    for a in arrays.values():
        a.setflags(write=False)  # shared by every pass of every command: nobody may change it
    return PipelineDescription(**{**d.__dict__, "values": arrays})


def features(d: PipelineDescription) -> frozenset[str]:
    """The names (keys of :data:`FEATURES`) of what ``d`` uses beyond version 1 as first published.

    A reader that implements version 1 and some features refuses ``d`` when ``features(d)`` holds one it
    does not implement; an empty set is a description every version-1 reader runs as the pipeline does.
    """
    used: set[str] = set()
    if d.cfg.combine is not None and d.cfg.combine != STANDARD_COMBINE:
        used.add(f"cfg.combine={d.cfg.combine}")
    if d.cfg.renorm is not None:
        used.add(f"cfg.renorm={d.cfg.renorm}")
    if d.cfg.batch_order != "uncond,cond":
        used.add(f"cfg.batch_order={d.cfg.batch_order}")
    if d.cfg.channels is not None:
        used.add("cfg.channels")
    if any(i.negative_fill is not None for i in d.inputs):
        used.add("inputs.negative_fill")
    if any(i.append_valid for i in d.inputs):
        used.add("inputs.append_valid")
    if d.image.num_frames is not None:
        used.add("image.num_frames")
    if d.latent.init == "tokens":
        used.add("latent.init=tokens")
    if d.scheduler.mu_rule is not None:
        used.add(f"scheduler.set_timesteps.mu_rule={d.scheduler.mu_rule}")
    unknown = used - FEATURES.keys()
    assert not unknown, unknown  # the schema admits only the values FEATURES names
    return frozenset(used)


# -- against a model -----------------------------------------------------------------------------
class _TensorLike(Protocol):
    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


class ModelLike(Protocol):
    """What :func:`check_against` reads of a model: a plan (:class:`rkpart.plan.plan.Plan`)
    or anything with its input and output names and their static types."""

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def outputs(self) -> tuple[str, ...]: ...

    @property
    def tensors(self) -> Mapping[str, _TensorLike]: ...


def check_against(d: PipelineDescription, model: ModelLike | Mapping[str, tuple[str, Sequence[int]]], *,
                  outputs: Sequence[str] | None = None, what: str | None = None) -> None:
    """Refuse ``d`` when it does not describe ``model``: the same input names, and each input
    with the same static shape and dtype; the description's output among the model's outputs.

    ``model`` is a plan (or anything with ``inputs``, ``outputs`` and ``tensors``) or a mapping
    ``input name -> (dtype, shape)`` (then ``outputs`` names the outputs, if known).
    """
    if isinstance(model, Mapping):
        types = {n: (str(dt), tuple(int(x) for x in s)) for n, (dt, s) in model.items()}
        outs = None if outputs is None else tuple(outputs)
    else:
        types = {n: (model.tensors[n].dtype, tuple(model.tensors[n].shape)) for n in model.inputs}
        outs = tuple(model.outputs) if outputs is None else tuple(outputs)
    label = what or f"pipeline description {d.path or FILENAME}"
    missing = [n for n in types if n not in d.names]
    extra = [n for n in d.names if n not in types]
    if missing or extra:
        parts = ([f"the model's input {missing[0]!r} is not in it"] if missing else []) + \
                ([f"its input {extra[0]!r} is not the model's"] if extra else [])
        raise SpecError(f"{label} does not match the model: {'; '.join(parts)} (model inputs: "
                        f"{', '.join(types)})")
    for i in d.inputs:
        dt, shape = types[i.name]
        if (dt, shape) != (i.dtype, i.shape):
            raise SpecError(f"{label} does not match the model: input {i.name!r} is {i.dtype} {list(i.shape)} in "
                            f"pipeline.json, {dt} {list(shape)} in the model")
    if outs is not None and d.output.name not in outs:
        raise SpecError(f"{label} does not match the model: output {d.output.name!r} is not the model's "
                        f"(model outputs: {', '.join(outs)})")


__all__ = [
    "CFG_MODES",
    "COMBINES",
    "EMBEDDING_ROLES",
    "FEATURES",
    "FILENAME",
    "FIXED_ROLES",
    "FORMAT",
    "MU_RULES",
    "PREDICTIONS",
    "RENORMS",
    "ROLES",
    "STANDARD_COMBINE",
    "VERSION",
    "CfgDesc",
    "ImageDesc",
    "InputDesc",
    "LatentDesc",
    "ModelLike",
    "OutputDesc",
    "PipelineDescription",
    "SchedulerDesc",
    "TimestepDesc",
    "TransformerDesc",
    "VaeDesc",
    "check_against",
    "features",
    "flux2_empirical_mu",
    "load_description",
    "parse_description",
    "schema",
]
