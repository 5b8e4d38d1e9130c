"""What the click commands share: option groups defined once, value parsing, error printing.

Each option group is a decorator that adds the same options, with the same names, help and
parsing, to every command that takes them (as Polygraphy's ``tools/args`` does):

==========================  =====================================================================
:func:`model_argument`      ``MODEL`` (an ONNX file; optional where the bundled example stands in)
:func:`shape_option`        ``--shape NAME=D0,D1,..`` -> ``shapes: dict[str, tuple[int, ...]]``
:func:`inputs_options`      ``--inputs X.npz`` and ``--seed`` (the seeded random inputs otherwise)
:func:`seed_option`         ``--seed`` alone (:data:`SEED`: 0 .. 2**32-1)
:class:`FiniteFloat`        a float range that refuses NaN and infinities (:data:`POSITIVE_MIB`: budgets)
:data:`STEPS`, :data:`ROUNDS` bounded counts (1 .. 10 000): denoising steps, measured rounds, repeats
:data:`SAMPLE_INTERVAL`     ``--interval``: finite seconds, 0 .. 60
:func:`threads_type`        ``--threads``: 0 .. 4 per core
:func:`role_options`        ``--latent-input``, ``--timestep-input``, ``--guidance-input``, ``--context-input``
                            -> ``role_flags: RoleFlags`` (:mod:`rkpart.roles`)
:data:`embeds_option`       ``--embeds FILE.npz`` (conditioning by diffusers call argument)
:func:`tolerance_options`   ``--reference``, ``--min-cosine``, ``--max-abs-rel``
:func:`device_option`       ``--adaln npu|host`` and the like
:func:`residency_option`    ``--residency plan|per-stage|resident``
:func:`toolkit_option`      ``--toolkit VERSION``
:func:`build_options`       ``--target``, ``--opt-level``, ``--single-core``, ``--config KEY=VALUE``
                            -> ``target`` and one ``rknn_config: dict`` (``RKNN.config`` options)
:func:`toolkits_dir_option` ``--toolkits-dir``
:func:`out_folder_option`   ``-o/--out DIR`` (with :func:`force_option`)
:func:`output_file_option`  ``-o/--output FILE``
:func:`quiet_option`        ``-q/--quiet`` (no progress lines; see :mod:`rkpart.progress`)
:func:`json_option`         ``--json`` (machine-readable stdout)
==========================  =====================================================================

Commands turn the parsed values into one frozen options object and call one library function;
they print its result and choose the exit code, nothing else.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from rkpart.errors import INTERRUPTED_EXIT, UserError, one_line, os_error
from rkpart.types import DEVICES, RESIDENCIES, JsonObject

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]
#: a click option or argument, applied to a command's function
OptionDecorator = Decorator[Callable[..., object]]

#: ``--residency plan``: each block as the plan chose (the auto strategy records a residency)
PLAN_RESIDENCY = "plan"


# -- errors ----------------------------------------------------------------------------------
def bundled_example() -> Path:
    """Path of the bundled tiny Anima-style example model."""
    from importlib import resources

    p = Path(str(resources.files("rkpart") / "data" / "anima_tiny.onnx"))
    if not p.is_file():
        raise UserError(f"the bundled example model is missing from the installation ({p})")
    return p


def lowering_note(opset: int) -> str | None:
    """"stages will be lowered from opset 20 to 19 for rknn-toolkit2 ..." for the target's documented
    and the installed toolkits, or ``None`` when every one of them loads ``opset``."""
    from rkpart.compile.toolkits import list_toolkits
    from rkpart.targets import get_target
    from rkpart.targets.opset import lowering_note as note

    target = get_target()
    versions = set(target.toolkits) | {t.version for t in list_toolkits(None)}
    return note(opset, {v: target.caps(v).max_opset for v in versions})


def report_user_error(e: UserError) -> None:
    """The one place a user error is printed (the group, :func:`user_errors`, click's usage
    errors): one line, at most :data:`~rkpart.errors.MAX_MESSAGE` characters."""
    click.echo(f"rkpart: error: {one_line(str(e))}", err=True)


def user_errors(fn: F) -> F:
    """Print a :class:`UserError` as one line and exit with its code.

    The ``rkpart`` group does the same; this keeps a command right when it is invoked on its
    own (``CliRunner().invoke(compile_cmd, ...)``, or embedded in another click group).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            outputs_are_not_inputs(click.get_current_context(silent=True))
            return fn(*args, **kwargs)
        except UserError as e:
            report_user_error(e)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("rkpart: interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)
        except OSError as e:
            err = os_error(e, "rkpart")
            if err is None:
                raise
            report_user_error(err)
            sys.exit(err.exit_code)

    return wrapper  # type: ignore[return-value]


def outputs_are_not_inputs(ctx: click.Context | None) -> None:
    """Issue 51's first output rule for every command at once, before it runs: no value of an
    :class:`OutputFile` / :class:`OutputFolder` parameter is (or, for a folder, lies inside or holds)
    the value of any other path parameter of the command (every ``click.Path`` that is no output: its
    plan, model, profiles, ``--embeds``, ``--pipeline``, ``--toolkits-dir``...), symlinks resolved and
    hard links compared by inode.  Declared by the types, so a new input option is covered without a
    line in the command (``fit X.jsonl -o X.jsonl`` overwrote its input)."""
    if ctx is None:
        return
    from rkpart.errors import OutputExistsError
    from rkpart.output import input_problem

    outs: list[tuple[click.Parameter, Path]] = []
    ins: list[str | os.PathLike[str]] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or not isinstance(param.type, click.Path):
            continue
        values = [v for v in (value if isinstance(value, (tuple, list)) else (value,)) if v not in (None, "")]
        if isinstance(param.type, (OutputFile, OutputFolder)):
            outs += [(param, Path(v)) for v in values]
        else:
            ins += values
    for param, out in outs:
        p = Path(os.path.abspath(out))
        why = input_problem(p, ins)
        if why is None and isinstance(param.type, OutputFolder):
            real = Path(os.path.realpath(p))
            held = next((i for i in ins if real in Path(os.path.realpath(i)).parents), None)
            why = None if held is None else f"contains {held}, one of its inputs"
        if why is not None:
            name = max(param.opts, key=len) if isinstance(param, click.Option) else (param.name or "").upper()
            raise OutputExistsError(f"{name} {p} {why}; rkpart never writes over what it reads: choose another path")


# -- value parsing ---------------------------------------------------------------------------
def parse_key_values(_ctx: click.Context | None, _param: click.Parameter | None,
                     values: tuple[str, ...]) -> JsonObject:
    """``KEY=VALUE`` options: the value as JSON when it parses (numbers, booleans, lists,
    dicts such as ``op_target``), else as a string."""
    out: JsonObject = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected key=value, e.g. optimization_level=2")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def parse_shapes(_ctx: click.Context | None, _param: click.Parameter | None,
                 values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """``NAME=D0,D1,...`` options: a static shape per model input, positive integers only."""
    out: dict[str, tuple[int, ...]] = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if sep and name else None
        except ValueError:
            shape = None
        if not shape or any(d <= 0 for d in shape):
            raise click.BadParameter(f"{v!r}: expected NAME=D0,D1,... with positive integers")
        out[name] = shape
    return out


def _compose(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(f: F) -> F:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


# -- model and shapes ------------------------------------------------------------------------
def model_argument(*, required: bool = False) -> OptionDecorator:
    """``MODEL``: an ONNX file (``model: Path | None`` when not required)."""
    return click.argument("model", required=required, type=click.Path(dir_okay=False, path_type=Path))


shape_option: OptionDecorator = click.option(
    "--shape", "shapes", multiple=True, callback=parse_shapes, metavar="NAME=D0,D1,..",
    help="Static shape for a model input with symbolic dimensions (repeatable).")


# -- bounded numbers ---------------------------------------------------------------------------
class FiniteFloat(click.FloatRange):
    """A ``click.FloatRange`` that also refuses NaN and infinities (``nan`` compares false with
    every bound, so a plain range lets it through)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v

    def _describe_range(self) -> str:
        # unbounded: click's own text would read "x<=None"
        return "finite" if self.min is None and self.max is None else str(super()._describe_range())


#: ``--seed``: what NumPy's generators accept, and what a user could mean
SEED = click.IntRange(min=0, max=2**32 - 1)
#: ``--budget-mib`` and other sizes in MiB: positive and finite
POSITIVE_MIB = FiniteFloat(min=0, min_open=True)
#: the most denoising steps, rounds or repeats a command accepts: more is no run that finishes
#: (and 10**30 steps overflowed NumPy's schedule with a traceback)
MAX_COUNT = 10_000
#: ``--steps`` of every command that runs or predicts a denoising loop
STEPS = click.IntRange(min=1, max=MAX_COUNT)
#: ``--rounds``, ``--verify-rounds``, ``--infer-repeat``: measured repetitions
ROUNDS = click.IntRange(min=1, max=MAX_COUNT)
#: ``--warmup``: rounds run before the measured ones (0: none)
WARMUP = click.IntRange(min=0, max=MAX_COUNT)
#: ``fit --folds``: 0 (leave one plan out) or k folds over the profiled plans
FOLDS = click.IntRange(min=0, max=MAX_COUNT)
#: ``drift --sim-memory``: MiB the simulator's workers may hold together, up to 16 TiB
SIM_MEMORY_MIB = click.IntRange(min=1, max=2**24)
#: ``partition --external-threshold``: bytes, up to 2 GiB (the largest tensor an ONNX file can hold inline)
EXTERNAL_THRESHOLD = click.IntRange(min=0, max=2**31)
#: ``profile --interval``: seconds between memory samples; NaN/inf (or 1e10 s) crashed the sampler
SAMPLE_INTERVAL = FiniteFloat(min=0, max=60)
#: ``--guidance`` (drift, bundle): the CFG scale, the range the bundle's runner accepts
#: (rkpart.runtime.board_runner.NUMBER_RANGES); 1e300 overflowed every latent to inf
GUIDANCE = FiniteFloat(min=-1000, max=1000)
#: ``--shift`` (drift, bundle): the sigma shift, as the runner; 1e-320 divided by zero in the schedule
SHIFT = FiniteFloat(min=1e-3, max=1e3)


def max_threads() -> int:
    """The most threads an option may ask for: 4 per core (more only queue on the same cores)."""
    return 4 * (os.cpu_count() or 1)


def threads_type() -> click.IntRange:
    return click.IntRange(min=0, max=max_threads())


# -- inputs and seed -------------------------------------------------------------------------
def seed_option(f: F) -> F:
    """``--seed``: the seed of the random plan inputs (:func:`rkpart.roles.pass_inputs`)."""
    return click.option("--seed", type=SEED, default=0, show_default=True,
                        help="Seed of the random plan inputs (floats ~ N(0,1); masks all-valid, id grids and "
                             "integer inputs their pipeline.json values, else zeros).")(f)


def inputs_options(f: F) -> F:
    """``--inputs X.npz`` and ``--seed``."""
    return _compose(
        click.option("--inputs", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help=".npz with one array per model input (default: seeded random inputs)."),
        seed_option,
    )(f)


# -- input roles (rkpart.roles) ----------------------------------------------------------------
def role_options(f: F) -> F:
    """``--latent-input``, ``--timestep-input``, ``--guidance-input``, ``--context-input`` -> one
    ``role_flags`` (:class:`rkpart.roles.RoleFlags`): which input is what when the plan has no
    pipeline description (with one, a flag must agree with it)."""

    @functools.wraps(f)
    def merge(*args: Any, latent_input: str | None, timestep_input: str | None, guidance_input: str | None,
              context_inputs: tuple[str, ...], **kwargs: Any) -> Any:
        from rkpart.roles import RoleFlags

        return f(*args, role_flags=RoleFlags(latent_input, timestep_input, guidance_input, tuple(context_inputs)),
                 **kwargs)

    return _compose(  # type: ignore[return-value]
        click.option("--latent-input", default=None, metavar="NAME",
                     help="The loop's latent input, for a plan without a pipeline.json [default: the input shaped "
                          "like the output; two such inputs are refused, not guessed]."),
        click.option("--timestep-input", default=None, metavar="NAME",
                     help="The loop's timestep input, for a plan without a pipeline.json [default: the smallest "
                          "other input; two of that size (e.g. timestep and guidance) are refused, not guessed]."),
        click.option("--guidance-input", default=None, metavar="NAME",
                     help="A guidance-distilled model's guidance input: fed the guidance scale, one pass per step "
                          "[default: the plan's pipeline.json; none without one]."),
        click.option("--context-input", "context_inputs", multiple=True, metavar="NAME",
                     help="A conditioning input of the loop (repeat for several) [default: every other float "
                          "input; inputs named like masks get ones, like ids are refused without a pipeline.json]."),
    )(merge)


embeds_option: OptionDecorator = click.option(
    "--embeds", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE.npz",
    help="The conditioning the pipeline gives the transformer, keyed by diffusers call argument (prompt_embeds, "
         "negative_prompt_embeds, pooled_prompt_embeds, prompt_attention_mask, ...), mapped to model inputs by the "
         "plan's pipeline.json [default: seeded noise, zeros for the unconditional pass].")


# -- tolerances ------------------------------------------------------------------------------
def tolerance_options(f: F) -> F:
    """The numerical gate: ``--reference``, ``--min-cosine``, ``--max-abs-rel``."""
    return _compose(
        click.option("--reference", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help=".npz of reference outputs (e.g. PyTorch's) to gate against, with the inputs they came "
                          "from (or --inputs). The whole model is then not loaded, unless --model names it."),
        click.option("--min-cosine", type=float, default=None,
                     help="Gate: minimum cosine [default: 0.999999 for ort, 0.999 for rknn-sim]."),
        click.option("--max-abs-rel", type=float, default=None,
                     help="Gate: max abs error relative to max |reference| [default: 1e-5 for ort, off otherwise]."),
    )(f)


# -- devices and residency ------------------------------------------------------------------
def device_option(name: str, *, help: str) -> OptionDecorator:
    """``--NAME npu|host``: where some part of a block runs (default ``None``: the strategy's)."""
    return click.option(f"--{name}", type=click.Choice(list(DEVICES)), default=None, help=help)


def residency_option(*, help: str) -> OptionDecorator:
    """``--residency plan|per-stage|resident``: how stage sessions live while a plan runs."""
    return click.option("--residency", type=click.Choice([PLAN_RESIDENCY, *RESIDENCIES]), default=PLAN_RESIDENCY,
                        show_default=True, help=help)


# -- toolkit ---------------------------------------------------------------------------------
def toolkit_option(*, help: str, required: bool = False, dest: str = "toolkit") -> OptionDecorator:
    """``--toolkit VERSION`` (a version installed with ``rkpart toolkit install``, or a python path)."""
    return click.option("--toolkit", dest, required=required, default=None, help=help)


toolkits_dir_option: OptionDecorator = click.option(
    "--toolkits-dir", type=click.Path(file_okay=False), default=None,
    help="Where toolkit venvs live (default $RKPART_TOOLKITS_DIR or ~/.cache/rkpart/toolkits).")


def build_options(f: F) -> F:
    """How rknn-toolkit2 builds: ``--target`` and the ``RKNN.config`` options, merged into one
    ``rknn_config`` dict (``--opt-level`` and ``--single-core`` override ``--config``)."""

    @functools.wraps(f)
    def merge(*args: Any, opt_level: int | None, single_core: bool, config: JsonObject, **kwargs: Any) -> Any:
        cfg = dict(config)
        if opt_level is not None:
            cfg["optimization_level"] = opt_level
        if single_core:
            cfg["single_core_mode"] = True
        return f(*args, rknn_config=cfg, **kwargs)

    return _compose(  # type: ignore[return-value]
        click.option("--target", default="rk3588", show_default=True,
                     help="target_platform for RKNN.config; a target rkpart knows (rkpart.targets), "
                          "checked before any build."),
        click.option("--opt-level", type=click.IntRange(0, 3), default=None, help="RKNN.config optimization_level."),
        click.option("--single-core", is_flag=True, help="RKNN.config single_core_mode=True."),
        click.option("--config", "config", multiple=True, callback=parse_key_values, metavar="KEY=VALUE",
                     help="Any other RKNN.config option (value parsed as JSON when possible; keys checked "
                          "against the toolkit's RKNN.config before any build)."),
    )(merge)


# -- output ----------------------------------------------------------------------------------
class OutputFile(click.Path):
    """The type of every option or argument naming a file a command writes (``-o FILE``,
    ``--accuracy``, ``--save-outputs``, ``example DEST``): each goes through
    :func:`rkpart.output.claim_output_file`, and the generated hostile suite finds them by it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("dir_okay", False)  # ``example DEST`` may name a folder to write into
        kwargs.setdefault("path_type", Path)
        super().__init__(**kwargs)


class OutputFolder(click.Path):
    """The type of every option naming a folder a command writes (``-o DIR``): each goes through
    :func:`rkpart.output.claim_output_folder` and the folder protocol of :mod:`rkpart.output`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("path_type", Path)
        super().__init__(file_okay=False, **kwargs)


def out_folder_option(*, default: str, help: str) -> OptionDecorator:
    """``-o/--out DIR``: the folder a command writes (``out: Path``)."""
    return click.option("--out", "-o", "out", type=OutputFolder(), default=Path(default),
                        show_default=True, help=help)


def output_file_option(*, help: str, required: bool = False) -> OptionDecorator:
    """``-o/--output FILE``: the file a command writes (``output: Path | None``)."""
    return click.option("-o", "--output", type=OutputFile(), required=required, default=None, help=help)


def force_option(*, help: str) -> OptionDecorator:
    return click.option("--force", is_flag=True, help=help)


# -- progress and json -----------------------------------------------------------------------
quiet_option: OptionDecorator = click.option("--quiet", "-q", is_flag=True, help="No progress lines.")


def json_option(*, help: str = "Machine-readable output on stdout.") -> OptionDecorator:
    return click.option("--json", "as_json", is_flag=True, help=help)


def strict_json(value: object) -> Any:
    """``value`` with every NaN or infinite float replaced by ``null``: ``--json`` output is strict
    JSON (RFC 8259 has no NaN; ``jq`` and most parsers reject Python's bare ``NaN``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def emit(as_json: bool, data: Callable[[], Any], text: Callable[[], str], *, sort_keys: bool = False) -> None:
    """Print a command's result on stdout: ``data()`` as indented, strict JSON with ``--json`` (a NaN
    or infinite number is ``null``), else ``text()``."""
    click.echo(json.dumps(strict_json(data()), indent=2, sort_keys=sort_keys, allow_nan=False) if as_json
               else text())


__all__ = [
    "EXTERNAL_THRESHOLD",
    "FOLDS",
    "MAX_COUNT",
    "PLAN_RESIDENCY",
    "POSITIVE_MIB",
    "ROUNDS",
    "SAMPLE_INTERVAL",
    "SEED",
    "SIM_MEMORY_MIB",
    "STEPS",
    "WARMUP",
    "FiniteFloat",
    "OutputFile",
    "OutputFolder",
    "build_options",
    "device_option",
    "embeds_option",
    "emit",
    "force_option",
    "inputs_options",
    "json_option",
    "max_threads",
    "model_argument",
    "out_folder_option",
    "output_file_option",
    "parse_key_values",
    "parse_shapes",
    "quiet_option",
    "report_user_error",
    "residency_option",
    "role_options",
    "seed_option",
    "shape_option",
    "threads_type",
    "tolerance_options",
    "toolkit_option",
    "toolkits_dir_option",
    "user_errors",
]
