"""Which model input is the latent, the timestep, the guidance, the conditioning, a mask or an id
grid, and what every command feeds each one (issue 48).

Roles come from, in this order:

1. the plan's pipeline description (``pipeline.json``, recorded by ``rkpart partition``:
   :func:`plan_description`);
2. flags (``--latent-input``, ``--timestep-input``, ``--guidance-input``, ``--context-input``);
3. the shape rule, a last resort that says it guessed: the latent is the input shaped like the
   output, the timestep the smallest other input.  Inputs named like masks or id grids are never
   candidates.  A tie (two inputs that fit one role, e.g. ``timestep`` and ``guidance`` of the
   same shape) is refused with one line naming the flags: the rule never picks one of them.

What each input is fed (the one input generator of every command):

* an input with a described ``value`` gets it (id grids, RoPE tables, constant masks);
* an attention mask without one gets all-valid (ones), or its call argument from ``--embeds``;
* an id grid, position ids or a RoPE table without a value: a denoising loop refuses it (rkpart
  does not make up a pipeline's positions); a one-pass check (``run``, ``profile``, the bundle's
  reference) gives zeros;
* any other integer or boolean input gets zeros (its neutral value), never noise;
* text and pooled embeddings come from ``--embeds`` (the description's ``argument`` and
  ``negative_argument``) or are seeded noise (zeros for the unconditional pass);
* the latent is seeded noise, the timestep ``scale * t + offset``, the guidance input
  ``guidance_input_scale * g`` (guidance-distilled models).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.description import EMBEDDING_ROLES, FILENAME, PipelineDescription, check_against, load_description
from rkpart.errors import SpecError, UserError
from rkpart.plan.plan import Plan, TensorInfo
from rkpart.types import JsonObject

#: the flags that name the loop's inputs when a plan has no pipeline description
ROLE_FLAGS = "--latent-input NAME --timestep-input NAME [--guidance-input NAME] [--context-input NAME ...]"
#: how to give a plan a description instead
DESCRIBE_HINT = "or give the plan a pipeline.json (rkpart export; rkpart partition --pipeline FILE)"
#: the plan folder's copy of the description (``plan.json`` ``extra.pipeline``)
PLAN_DIR = "pipeline"
#: ``plan.json`` ``extra`` key of the recorded description
EXTRA_KEY = "pipeline"

#: names of inputs that are masks (all-valid without a value) or id grids / positions / RoPE tables
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
ID_NAME = re.compile(r"(^|_)ids?($|_)|position|indices|rope|rotary|freqs", re.IGNORECASE)
#: roles the loop draws seeded noise for (conditional pass) when ``--embeds`` does not give them
DRAWN_ROLES = frozenset({*EMBEDDING_ROLES, "image_latents"})
ID_ROLES = frozenset({"image_ids", "text_ids", "position_ids", "rope"})
#: how each source of roles is named in messages and the bundle's manifest
BY_DESCRIPTION, BY_FLAGS, BY_SHAPE = "pipeline.json", "flags", "shape (guessed)"


# -- the plan's description ---------------------------------------------------------------------
def description_beside(model: Path) -> Path | None:
    """``pipeline.json`` beside ``model`` (what ``rkpart export`` writes), if there is one (it
    describes ``model`` only when its ``transformer.file`` names it: :func:`model_description`)."""
    p = model.parent / FILENAME
    return p if p.exists() else None


def plan_description(plan: Plan, folder: str | os.PathLike[str]) -> PipelineDescription | None:
    """The description ``rkpart partition`` recorded in the plan folder, checked against the plan
    (its bytes against the sha256 in ``plan.json``), or ``None`` when the plan has none."""
    from rkpart.io import confined_file, file_sha256

    rec = plan.extra.get(EXTRA_KEY)
    if rec is None:
        return None
    if not isinstance(rec, Mapping) or not isinstance(rec.get("file"), str):
        raise SpecError("plan.json extra.pipeline must name the plan's pipeline.json ({'file': ..., 'sha256': ...})")
    p = confined_file(Path(folder), rec["file"], what="plan's pipeline description", error=SpecError)
    for rel, sha in ((rec["file"], rec.get("sha256")), (rec.get("values"), rec.get("values_sha256"))):
        if rel is not None and file_sha256(confined_file(Path(folder), rel, what="plan's pipeline values",
                                                         error=SpecError)) != sha:
            raise SpecError(f"{Path(folder) / rel} changed since rkpart partition recorded it (sha256 differs); "
                            "partition again")
    d = load_description(p)
    check_against(d, plan, what=f"the plan's pipeline description {p}")
    return d


def description_record(d: PipelineDescription) -> JsonObject:
    """What ``plan.json`` ``extra.pipeline`` records of the description copied into the plan."""
    from rkpart.io import file_sha256

    assert d.path is not None
    rec: JsonObject = {"file": f"{PLAN_DIR}/{FILENAME}", "sha256": d.sha256, "pipeline": d.pipeline_class,
                           "values": None, "values_sha256": None}
    if d.values_file is not None:
        rec.update(values=f"{PLAN_DIR}/{d.values_file}", values_sha256=file_sha256(d.path.parent / d.values_file))
    return rec


def copy_description(d: PipelineDescription, folder: Path) -> None:
    """Copy ``pipeline.json`` and its values into ``folder/pipeline/`` (the plan's staging folder)."""
    import shutil

    from rkpart.io import atomic_writer

    assert d.path is not None
    (folder / PLAN_DIR).mkdir(exist_ok=True)
    for name in (FILENAME, *((d.values_file,) if d.values_file else ())):
        with atomic_writer(folder / PLAN_DIR / name) as tmp:
            shutil.copyfile(d.path.parent / (d.path.name if name == FILENAME else name), tmp)


def model_description(model: Path, explicit: Path | None, model_io: Mapping[str, tuple[str, Sequence[int]]],
                      outputs: Sequence[str]) -> PipelineDescription | None:
    """``rkpart partition``'s description: ``explicit`` (``--pipeline FILE``) or the
    ``pipeline.json`` beside ``model``, checked against the model's inputs; ``None`` without one."""
    p = explicit if explicit is not None else description_beside(model)
    if p is None:
        return None
    d = load_description(p)
    if explicit is None and d.transformer.file != model.name:
        # rkpart export's folder also holds vae_decoder.onnx: the description beside it is not its own
        return None
    check_against(d, model_io, outputs=outputs)
    return d


def describe_partition(model: Path, explicit: Path | None, graph: Any,
                       progress: Callable[[str], None] | None = None) -> PipelineDescription | None:
    """``rkpart partition``'s description for the loaded model ``graph`` (a
    :class:`~rkpart.ir.graph.ModelGraph`: ``inputs``, ``outputs``, ``tensor_types``), or ``None``.

    Raises
    ------
    SpecError
        The description is invalid or does not match the model's inputs (one line, exit 5).
    """
    io = {n: graph.tensor_types[n] for n in graph.inputs}
    d = model_description(model, explicit, io, graph.outputs)
    if d is not None and progress is not None:
        progress(f"pipeline description {d.path}: {d.pipeline_class}, roles "
                 + ", ".join(f"{i.name}={i.role}" for i in d.inputs))
    return d


def record_description(part: Any, d: PipelineDescription | None) -> Any:
    """``part`` (a :class:`~rkpart.grouping.groups.Partition`) with ``d`` named in its
    ``extra`` (what ``plan.json`` records); unchanged without a description, so a plan without
    one stays byte-identical."""
    import dataclasses

    if d is None:
        return part
    return dataclasses.replace(part, extra={**part.extra, EXTRA_KEY: description_record(d)})


def description_attacher(d: PipelineDescription | None) -> Callable[[Path], None] | None:
    """What ``write_partition`` calls on the plan's staging folder: copy ``d`` into it."""
    if d is None:
        return None
    return lambda staging: copy_description(d, staging)


# -- roles ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoleFlags:
    """Inputs named on the command line (``--latent-input`` ...); empty: none named."""

    latent: str | None = None
    timestep: str | None = None
    guidance: str | None = None
    context: tuple[str, ...] = ()

    @property
    def named(self) -> tuple[str, ...]:
        return tuple(n for n in (self.latent, self.timestep, self.guidance, *self.context) if n is not None)


#: no flags given
NO_FLAGS = RoleFlags()


@dataclass(frozen=True)
class InputRoles:
    """The role of every model input (:data:`rkpart.description.ROLES`), the velocity output, and
    where they came from (:data:`BY_DESCRIPTION`, :data:`BY_FLAGS`, :data:`BY_SHAPE`)."""

    roles: Mapping[str, str]
    output: str
    source: str
    description: PipelineDescription | None = field(default=None, compare=False)

    def named(self, *roles: str) -> tuple[str, ...]:
        return tuple(n for n, r in self.roles.items() if r in roles)

    def _one(self, role: str) -> str | None:
        got = self.named(role)
        return got[0] if got else None

    @property
    def latent(self) -> str:
        got = self._one("latent")
        assert got is not None
        return got

    @property
    def timestep(self) -> str | None:
        return self._one("timestep")

    @property
    def guidance(self) -> str | None:
        return self._one("guidance")

    @property
    def context(self) -> tuple[str, ...]:
        """The inputs the loop draws (or takes from ``--embeds``) per pass: embeddings, image
        latents, and float inputs of role ``other`` without a value."""
        return tuple(n for n, r in self.roles.items() if r in DRAWN_ROLES or (r in ("other", "class_labels")
                                                                                and self._drawn_other(n)))

    def _drawn_other(self, name: str) -> bool:
        d = self.description
        if d is not None and d.input(name).value is not None:
            return False
        if d is not None and d.input(name).argument is not None:
            return True
        dt = d.input(name).dtype if d is not None else self._dtypes.get(name, "float32")
        return np.dtype(dt).kind == "f"

    _dtypes: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def summary(self) -> str:
        parts = [f"latent {self.latent}", f"timestep {self.timestep or 'none'}"]
        if self.guidance:
            parts.append(f"guidance {self.guidance}")
        parts.append(f"conditioning {', '.join(self.context) or 'none'}")
        fixed = [f"{n} ({r})" for n, r in self.roles.items() if n not in (self.latent, self.timestep, self.guidance)
                 and n not in self.context]
        if fixed:
            parts.append(f"fixed {', '.join(fixed)}")
        return "; ".join(parts)


def name_role(name: str, dtype: str) -> str | None:
    """The role a name gives away without a description: masks and id grids (never guessed from
    shape); ``None`` for every other name."""
    if MASK_NAME.search(name):
        return "attention_mask"
    if ID_NAME.search(name):
        return "position_ids"
    return None


def _single_output(plan: Plan) -> str:
    if len(plan.outputs) != 1:
        raise SpecError(f"the denoising loop needs a model with one output (the velocity); this one has "
                        f"{len(plan.outputs)}")
    return plan.outputs[0]


def resolve_roles(plan: Plan, description: PipelineDescription | None = None, flags: RoleFlags = NO_FLAGS, *,
                  progress: Callable[[str], None] | None = None) -> InputRoles:
    """The roles of ``plan``'s inputs: from ``description``, else from ``flags``, else guessed by
    the shape rule (see the module doc); ``progress`` hears where they came from.

    Raises
    ------
    UserError
        A flag names something that is not a model input, or one input twice; flags that
        disagree with the description.
    SpecError
        The rule cannot map the model: no input shaped like the output, no timestep, or a tie
        (one line naming the flags).
    """
    say = progress or (lambda _m: None)
    for n in flags.named:
        if n not in plan.inputs:
            raise UserError(f"{n!r} is not an input of the model (its inputs: {', '.join(plan.inputs)})")
    if len(set(flags.named)) != len(flags.named):
        raise UserError("--latent-input, --timestep-input, --guidance-input and --context-input must name "
                        "different inputs")
    if description is not None:
        return _from_description(plan, description, flags, say)
    out = _single_output(plan)
    dtypes = {n: plan.tensors[n].dtype for n in plan.inputs}
    named = {n: r for n in plan.inputs if n not in flags.named and (r := name_role(n, dtypes[n])) is not None}
    free = [n for n in plan.inputs if n not in flags.named and n not in named]
    guessed: list[str] = []
    latent = flags.latent
    if latent is None:
        shape = plan.tensors[out].shape
        fits = [n for n in free if plan.tensors[n].shape == shape]
        if not fits:
            raise SpecError(f"no model input has the output's shape {list(shape)}: cannot tell the latent; name the "
                            f"inputs with {ROLE_FLAGS} {DESCRIBE_HINT}")
        if len(fits) > 1:
            raise SpecError(f"{len(fits)} inputs fit the latent (shaped like the output {list(shape)}): "
                            f"{', '.join(fits)}; rkpart does not guess: name it with --latent-input NAME "
                            f"{DESCRIBE_HINT}")
        latent = fits[0]
        guessed.append("latent")
    free = [n for n in free if n != latent]
    timestep = flags.timestep
    if timestep is None:
        if not free:
            raise SpecError(f"no timestep input besides the latent; name the inputs with {ROLE_FLAGS} {DESCRIBE_HINT}")
        size = min(int(np.prod(plan.tensors[n].shape)) for n in free)
        fits = [n for n in free if int(np.prod(plan.tensors[n].shape)) == size]
        if len(fits) > 1:
            raise SpecError(f"{len(fits)} inputs fit the timestep (the smallest, {size} element"
                            f"{'s' if size != 1 else ''}): {', '.join(fits)}; rkpart does not guess which is the "
                            f"timestep (a guidance input looks the same): name them with --timestep-input NAME "
                            f"[--guidance-input NAME] {DESCRIBE_HINT}")
        timestep = fits[0]
        guessed.append("timestep")
    roles: dict[str, str] = {}
    for n in plan.inputs:
        if n == latent:
            roles[n] = "latent"
        elif n == timestep:
            roles[n] = "timestep"
        elif n == flags.guidance:
            roles[n] = "guidance"
        elif n in flags.context:
            roles[n] = "text_embeddings"
        elif n in named:
            roles[n] = named[n]
        elif flags.context:
            raise UserError(f"model input {n!r} has no role in the loop; add it with --context-input")
        else:
            roles[n] = "text_embeddings" if np.dtype(dtypes[n]).kind == "f" else "other"
    got = InputRoles(roles, out, BY_SHAPE if guessed else BY_FLAGS, None, dtypes)
    if guessed:
        say(f"roles guessed from shapes (no pipeline.json; {', '.join(guessed)} not named by flags): "
            f"{got.summary()}")
    else:
        say(f"roles from flags: {got.summary()}")
    return got


def _from_description(plan: Plan, d: PipelineDescription, flags: RoleFlags,
                      say: Callable[[str], None]) -> InputRoles:
    check_against(d, plan, what="the plan's pipeline description")
    for flag, role, name in (("--latent-input", "latent", flags.latent),
                             ("--timestep-input", "timestep", flags.timestep),
                             ("--guidance-input", "guidance", flags.guidance)):
        if name is not None and d.role_input(role) != name:
            raise UserError(f"{flag} {name}: the plan's pipeline.json says {role} is "
                            f"{d.role_input(role) or 'no input'}; drop the flag")
    for n in flags.context:
        if d.input(n).role not in DRAWN_ROLES | {"other"}:
            raise UserError(f"--context-input {n}: the plan's pipeline.json says it is {d.input(n).role}; "
                            "drop the flag")
    r = InputRoles({i.name: i.role for i in d.inputs}, d.output.name, BY_DESCRIPTION, d)
    if d.role_input("timestep") is None:
        raise SpecError("the plan's pipeline.json has no input with role 'timestep': rkpart's loop cannot feed it")
    say(f"roles from the plan's pipeline.json ({d.pipeline_class}): {r.summary()}")
    return r


# -- what each input is fed ---------------------------------------------------------------------
def _neutral(name: str, role: str, info: TensorInfo, d: PipelineDescription | None, *, loop: bool) -> np.ndarray:
    """The fixed value of an input that is not drawn: its described value, ones for a mask,
    zeros otherwise (an id grid without a value only outside a loop)."""
    if d is not None:
        v = d.value_of(name)
        if v is not None:
            return v
    shape, dt = tuple(info.shape), np.dtype(info.dtype)
    if role == "attention_mask":
        return np.ones(shape, dt)
    if role in ID_ROLES and loop:
        what = "an id grid / RoPE table" if d is None else f"{role} with no value in the plan's pipeline.json"
        raise SpecError(f"input {name!r} is {what}: rkpart does not make up a pipeline's positions; "
                        + ("give the plan a pipeline.json (rkpart export; rkpart partition --pipeline FILE)"
                           if d is None else "export the pipeline again (rkpart export)"))
    return np.zeros(shape, dt)


def fixed_inputs(plan: Plan, roles: InputRoles, *, loop: bool = True) -> dict[str, np.ndarray]:
    """Every input that is neither the latent, the timestep, the guidance nor drawn conditioning:
    its value, ones for masks, zeros for other integer inputs (see the module doc)."""
    skip = {roles.latent, roles.timestep, roles.guidance, *roles.context}
    return {n: _neutral(n, r, plan.tensors[n], roles.description, loop=loop)
            for n, r in roles.roles.items() if n not in skip}


def pass_inputs(plan: Plan, folder: str | os.PathLike[str] | None, seed: int = 0,
                description: PipelineDescription | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs of one pass (``rkpart run``, ``profile``, the bundle's reference): floats
    ~ N(0, 1) as :func:`rkpart.ir.tensors.random_feeds` draws them, except masks (ones, or the
    described value), id grids and RoPE tables (the described value, else zeros), and integer or
    boolean inputs (their value, else zeros).  ``folder``: the plan's, for its description."""
    from rkpart.ir.tensors import random_feeds

    missing = [n for n in plan.inputs if n not in plan.tensors]
    if missing:
        raise SpecError(f"plan input {missing[0]!r} has no entry in plan.tensors; pass inputs explicitly")
    d = description if description is not None else (plan_description(plan, folder) if folder is not None else None)
    # drawn as before for every input, so the floats of a model stay the same seeded values
    feeds = random_feeds(((n, plan.tensors[n].dtype, plan.tensors[n].shape) for n in plan.inputs), seed)
    for n in plan.inputs:
        info = plan.tensors[n]
        role = d.input(n).role if d is not None else (name_role(n, info.dtype) or "other")
        fixed = role in ID_ROLES or role == "attention_mask" or (d is not None and d.input(n).value is not None)
        if fixed or np.dtype(info.dtype).kind != "f":
            feeds[n] = _neutral(n, role, info, d, loop=False)
    return feeds


# -- --embeds ------------------------------------------------------------------------------------
#: the conditional and the unconditional pass's inputs given by ``--embeds``
Embeds = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


def load_embeds(path: str | os.PathLike[str], roles: InputRoles, plan: Plan, *, cfg: bool) -> Embeds:
    """``--embeds FILE.npz`` (keys: diffusers call arguments) as the conditional and the
    unconditional pass's inputs, mapped by the description's ``argument`` / ``negative_argument``.

    Under ``cfg.mode == "batched"`` an argument holds one row of the batch-2 input (the
    unconditional row is the input's first).  ``cfg``: the unconditional pass runs, so its
    arguments are needed too.

    Raises
    ------
    UserError
        No description, a missing key, or an array of another shape or dtype than the input takes.
    """
    from rkpart.io import check_finite_arrays
    from rkpart.readers import read_npz

    d = roles.description
    if d is None:
        raise UserError(f"--embeds {path}: its keys are diffusers call arguments, which only the plan's pipeline.json "
                        "maps to model inputs; this plan has none (rkpart partition --pipeline FILE)")
    wanted: list[tuple[str, str, str]] = []  # (input, argument, pass)
    for i in d.inputs:
        if i.value is not None or i.role in ("latent", "timestep", "guidance"):
            continue
        if i.argument is not None:
            wanted.append((i.name, i.argument, "cond"))
        if cfg and i.negative_argument is not None:
            wanted.append((i.name, i.negative_argument, "uncond"))
    if not wanted:
        raise UserError(f"--embeds {path}: the plan's pipeline.json takes no input from a call argument")
    arrays = read_npz(path, what="--embeds file", names=sorted({a for _, a, _ in wanted}))
    keys = ", ".join(sorted(read_npz_names(path))) or "none"
    check_finite_arrays(arrays, what=f"--embeds file {path}")
    batched = d.cfg.mode == "batched"
    out: dict[str, dict[str, np.ndarray]] = {"cond": {}, "uncond": {}}
    for name, arg, which in wanted:
        a = arrays.get(arg)
        i = d.input(name)
        if a is None:
            raise UserError(f"--embeds {path} has no {arg!r} (input {name!r}, {which} pass; its keys: {keys})")
        shape = half_shape(i.shape) if batched else i.shape
        want = np.dtype(i.dtype)
        if tuple(a.shape) != shape:
            raise UserError(f"--embeds {path}: {arg!r} is {list(a.shape)}; input {name!r} takes {list(shape)}"
                            + (" (one row of its batch-2 CFG pair)" if batched else ""))
        ok = a.dtype == want or (a.dtype.kind == want.kind == "f") or \
            (i.role == "attention_mask" and a.dtype.kind in "biu" and want.kind in "biuf")
        if not ok:
            raise UserError(f"--embeds {path}: {arg!r} is {a.dtype}; input {name!r} takes {want}")
        out[which][name] = a.astype(want, copy=False)
    return out["cond"], out["uncond"]


def read_npz_names(path: str | os.PathLike[str]) -> list[str]:
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return [n[:-4] for n in z.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile):
        return []


def half_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """One row of a batch-2 CFG pair."""
    return (shape[0] // 2, *shape[1:])


# -- the denoising loop's inputs -----------------------------------------------------------------
#: the CFG scale without a description or ``--guidance``
DEFAULT_GUIDANCE = 4.0
#: model timestep per unit sigma without a description (``rkpart drift``'s rule since issue 19)
TIMESTEP_SCALE = 1000.0


@dataclass
class LoopInputs:
    """What the flow-matching loop of ``rkpart drift`` (and the bundle runner, which gets the same
    record) feeds the model each step: the seeded initial latent, the conditioning of each pass,
    the fixed inputs, and how sigma becomes the timestep and ``g`` the guidance input.

    ``mode``: ``two-pass`` (a conditional and an unconditional call per step with CFG),
    ``batched`` (one call on the ``[uncond, cond]`` pair), ``distilled`` (one call, ``g`` fed to
    the guidance input), ``none`` (one call)."""

    roles: InputRoles
    mode: str
    x0: np.ndarray
    cond: dict[str, np.ndarray]
    uncond: dict[str, np.ndarray]
    fixed: dict[str, np.ndarray]
    timestep_scale: float
    timestep_offset: float
    guidance_scale: float
    guidance_input_scale: float
    tensors: Mapping[str, TensorInfo]
    sign: float = 1.0
    learned_sigma: bool = False
    channels_axis: int = 1
    #: where the conditioning came from, for progress lines
    conditioning: str = "seeded noise (zeros for the unconditional pass)"

    def kinds(self, cfg: bool) -> tuple[str, ...]:
        """The passes of one step: ``cond``/``uncond`` (two-pass with CFG), ``pair`` (batched), ``cond``."""
        if self.mode == "batched":
            return ("pair",)
        return ("cond", "uncond") if cfg and self.mode == "two-pass" else ("cond",)

    def timestep_value(self, sigma: float) -> float:
        return float(sigma * self.timestep_scale + self.timestep_offset)

    def feeds(self, x: np.ndarray, sigma: float, guidance: float, cfg: bool) -> list[dict[str, np.ndarray]]:
        """The model inputs of every pass of one step (:meth:`kinds`)."""
        r = self.roles
        ts = self.tensors[r.timestep] if r.timestep else None
        common: dict[str, np.ndarray] = dict(self.fixed)
        if ts is not None and r.timestep is not None:
            common[r.timestep] = np.full(ts.shape, self.timestep_value(sigma), dtype=ts.dtype)
        if r.guidance is not None:
            gi = self.tensors[r.guidance]
            common[r.guidance] = np.full(gi.shape, guidance * self.guidance_input_scale, dtype=gi.dtype)
        if self.mode == "batched":
            pair = {n: np.concatenate([self.uncond[n], self.cond[n]]) for n in self.cond}
            return [{**common, r.latent: np.concatenate([x, x]), **pair}]
        return [{**common, r.latent: x, **(self.cond if k == "cond" else self.uncond)} for k in self.kinds(cfg)]

    def velocity(self, outs: Sequence[Mapping[str, np.ndarray]], guidance: float, cfg: bool) -> np.ndarray:
        """The velocity of one step (float32) from the outputs of :meth:`feeds`' passes: CFG
        combined as ``uncond + g * (cond - uncond)``, the learned-sigma half dropped, the sign applied."""
        def model_output(a: np.ndarray) -> np.ndarray:
            a = np.asarray(a, dtype=np.float32)
            if self.learned_sigma:
                a = np.split(a, 2, axis=self.channels_axis)[0]
            return a * self.sign if self.sign != 1 else a

        out = self.roles.output
        if self.mode == "batched":
            vu, vc = np.split(model_output(outs[0][out]), 2)
            with np.errstate(over="ignore", invalid="ignore"):
                return vu + guidance * (vc - vu) if cfg else vc
        v = model_output(outs[0][out])
        if len(outs) > 1:
            vu = model_output(outs[1][out])
            with np.errstate(over="ignore", invalid="ignore"):
                v = vu + guidance * (v - vu)
        return v


def loop_mode(roles: InputRoles) -> str:
    d = roles.description
    if d is not None:
        return d.cfg.mode
    return "distilled" if roles.guidance is not None else "two-pass"


#: features of pipeline.json (:data:`rkpart.description.FEATURES`) this loop runs as the pipeline does: it draws
#: its own latent in the loop's layout and steps rkpart's own sigmas (so ``latent.init``, ``mu`` and the decoded
#: frames do not reach it), and an unconditional pass without a negative argument gets zeros already (a
#: ``negative_fill`` of 0)
LOOP_FEATURES = frozenset({"image.num_frames", "latent.init=tokens", "scheduler.set_timesteps.mu_rule=flux2_empirical",
                           "inputs.negative_fill"})


def loop_inputs(plan: Plan, roles: InputRoles, *, seed: int = 0,
                embeds: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None,
                guidance: float | None = None, timestep_scale: float = TIMESTEP_SCALE,
                implemented: frozenset[str] | None = LOOP_FEATURES) -> LoopInputs:
    """The inputs of the loop through ``plan`` (see :class:`LoopInputs`).

    ``implemented``: the description features the caller's loop runs as the pipeline does (rkpart's
    own loop: :data:`LOOP_FEATURES`; a description using another is refused); ``None``: the caller
    checks them itself (the board's loop, :func:`rkpart.bundle.loop.check_features`), and reads
    only the roles, fixed inputs and scales of what is returned.

    Drawn from ``numpy.random.default_rng(seed)``: the latent first, then each conditioning input
    in the roles' order (standard normal, cast to its dtype) unless ``embeds`` (the conditional
    and the unconditional pass's inputs, :func:`load_embeds`) give it; the unconditional pass gets
    zeros where ``embeds`` give nothing.
    """
    d = roles.description
    mode = loop_mode(roles)
    if d is not None and implemented is not None:
        from rkpart.description import features

        missing = sorted(features(d) - implemented)
        if any(i.negative_fill not in (None, 0) for i in d.inputs):  # the loop's unconditional default is zeros
            missing.append("inputs.negative_fill (not zeros)")
        if missing:
            raise SpecError(f"the plan's pipeline.json uses {', '.join(missing)}, which rkpart's denoising loop does "
                            "not implement (docs/pipeline-json.md, Features); it would not run the pipeline's loop")
    if roles.timestep is None:
        raise SpecError("the loop needs a timestep input; the plan's pipeline.json names none")
    out_shape = plan.tensors[roles.output].shape
    lat = plan.tensors[roles.latent]
    learned = bool(d.output.learned_sigma) if d is not None else False
    axis = d.output.channels_axis if d is not None else 1
    want = tuple(out_shape)
    if learned:
        want = tuple(n // 2 if k == axis % len(want) else n for k, n in enumerate(want))
    if tuple(lat.shape) != want:
        raise SpecError(f"the latent {roles.latent!r} {list(lat.shape)} does not have the "
                        f"{'model output without its learned-sigma half' if learned else 'output'}'s shape "
                        f"{list(want)}; the loop cannot step it")
    batched = mode == "batched"
    if batched and lat.shape[0] != 2:
        raise SpecError(f"cfg.mode 'batched' but the latent {roles.latent!r} has batch {lat.shape[0]}, not 2")
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(half_shape(lat.shape) if batched else lat.shape).astype(lat.dtype)
    given_c, given_u = (dict(embeds[0]), dict(embeds[1])) if embeds is not None else ({}, {})
    per_pass = list(roles.context) + [n for n in (*given_c, *given_u) if n not in roles.context]
    fixed = {n: v for n, v in fixed_inputs(plan, roles).items() if n not in per_pass}
    cond: dict[str, np.ndarray] = {}
    uncond: dict[str, np.ndarray] = {}
    for n in per_pass:
        info = plan.tensors[n]
        shape = half_shape(info.shape) if batched else tuple(info.shape)
        if n in given_c:
            cond[n] = given_c[n]
        elif n in roles.context:
            cond[n] = rng.standard_normal(shape).astype(info.dtype)
        else:  # a mask or other fixed input only the unconditional pass's arguments give
            full = _neutral(n, roles.roles[n], info, d, loop=True)
            cond[n] = full[: shape[0]] if batched else full
        if n in given_u:
            uncond[n] = given_u[n]
        elif n in roles.context:
            uncond[n] = np.zeros_like(cond[n])
        else:
            full = _neutral(n, roles.roles[n], info, d, loop=True)
            uncond[n] = full[: shape[0]] if batched else full
    if d is not None:
        num_train = d.scheduler.config.get("num_train_timesteps", 1000)
        t_scale = float(d.timestep.scale) * float(num_train if isinstance(num_train, (int, float)) else 1000)
        t_offset = float(d.timestep.offset)
        g = guidance if guidance is not None else (d.cfg.guidance_scale if d.cfg.guidance_scale is not None
                                                   else DEFAULT_GUIDANCE)
        gscale = d.cfg.guidance_input_scale
        sign, chan = float(d.output.sign), int(d.output.channels_axis)
    else:
        t_scale, t_offset = float(timestep_scale), 0.0
        g = guidance if guidance is not None else DEFAULT_GUIDANCE
        gscale, sign, chan = 1.0, 1.0, 1
    source = ("--embeds" if embeds is not None else
              "seeded noise (zeros for the unconditional pass)" if roles.context else "none")
    return LoopInputs(roles, mode, x0, cond, uncond, fixed, t_scale, t_offset, float(g), gscale, plan.tensors,
                      sign, learned, chan, source)


__all__ = [
    "BY_DESCRIPTION",
    "BY_FLAGS",
    "BY_SHAPE",
    "DEFAULT_GUIDANCE",
    "DESCRIBE_HINT",
    "NO_FLAGS",
    "ROLE_FLAGS",
    "TIMESTEP_SCALE",
    "InputRoles",
    "LoopInputs",
    "RoleFlags",
    "copy_description",
    "describe_partition",
    "description_attacher",
    "description_beside",
    "description_record",
    "fixed_inputs",
    "half_shape",
    "load_embeds",
    "loop_inputs",
    "loop_mode",
    "model_description",
    "name_role",
    "pass_inputs",
    "plan_description",
    "record_description",
    "resolve_roles",
]
