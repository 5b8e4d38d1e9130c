"""``rkpart repro``: version matrix -> reduction -> bug-report artifact folder.

Recipe: resolve every toolkit and load the model (all user errors before anything is
written) -> lock the output folder -> build the model with each version -> reduce it
against the first failing version -> build the reduced graph with each version -> write the
reduced ONNX, the standalone script, ``matrix.json`` and ``README.md``.

Artifact folder::

    README.md          bug-report text: summary, environment, steps, matrices, graph, log tail
    reduced.onnx       the minimal failing graph
    repro.py           standalone reproducer (stdlib + rknn-toolkit2 only, model embedded)
    matrix.json        both matrices, the verdict, the reduction's statistics
    logs/              build logs: original.<version>.log, reduced.<version>.log
    work/              reduction scratch: outcomes.json (cache by graph hash), reduction.json
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from rkpart.compile.preflight import check_config, check_target
from rkpart.compile.runner import WORKER
from rkpart.compile.toolkits import Toolkit, find_toolkit
from rkpart.errors import OutputExistsError, UserError
from rkpart.io import atomic_write_bytes, folder_lock
from rkpart.ir import load_model, value_type
from rkpart.progress import Progress
from rkpart.readers import FileKind
from rkpart.targets.known_issues import KnownIssue, find_signature
from rkpart.triage.matrix import BuildSettings, Matrix, MatrixRow, build_matrix, version_key
from rkpart.triage.reduce import FailureSpec, Reduction, ReductionError, reduce_graph
from rkpart.triage.script import SCRIPT_NAME, render_script
from rkpart.types import JsonMap, JsonObject

#: a repro folder's ``matrix.json`` (how ``repro --force`` knows a folder an older rkpart wrote)
MATRIX_KIND = FileKind("repro matrix", "json", 64 << 20, UserError, symlinks=False,
                       doc="a repro folder's `matrix.json`, read by `repro --force`")
REDUCED_NAME = "reduced.onnx"
WORK_DIR = "work"
LOG_DIR = "logs"


@dataclass(frozen=True)
class ReproReport:
    """What ``repro`` found and wrote."""

    folder: Path
    original: Matrix
    reduced: Matrix | None
    reduction: Reduction | None
    reduce_version: str | None
    signature: KnownIssue | None

    @property
    def reproduced(self) -> bool:
        """A reduced graph that fails with the version it was reduced against was written."""
        return (self.reduced is not None and self.reduce_version is not None
                and self.reduce_version in self.reduced.failing)

    def to_json(self) -> JsonObject:
        return {
            "original": self.original.to_json(),
            "reduced": self.reduced.to_json() if self.reduced else None,
            "reduce_version": self.reduce_version,
            "reduction": ({k: v for k, v in self.reduction.to_json().items() if k != "attempts"}
                          if self.reduction else None),
            "signature": self.signature.to_json() if self.signature else None,
        }

    def summary(self) -> str:
        lines = [f"original model {self.original.model} ({self.original.num_nodes} nodes):",
                 self.original.format_table(), f"verdict: {self.original.verdict()}"]
        if self.reduction is not None and self.reduced is not None:
            r = self.reduction
            state = "" if r.complete else " (time budget ran out: may not be minimal)"
            lines += ["", f"reduced against {self.reduce_version}: {r.original_nodes} -> {r.candidate.num_nodes} "
                          f"nodes in {r.builds} builds ({r.cache_hits} cached), {r.wall_s:.0f} s{state}",
                      self.reduced.format_table(), f"verdict: {self.reduced.verdict()}"]
        if self.signature is not None:
            lines += ["", self.signature.describe()]
        lines.append(f"artifact: {self.folder}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ReproOptions:
    """Everything ``rkpart repro MODEL`` was asked to do (see :func:`reproduce` for each field)."""

    versions: tuple[str, ...]
    target: str = "rk3588"
    config: JsonMap = field(default_factory=dict)
    fail_regex: str | None = None
    max_time: float = 1800.0
    build_timeout: float | None = None
    reduce_with: str | None = None
    reduce: bool = True
    toolkits_dir: str | os.PathLike[str] | None = None
    force: bool = False
    worker: Path = WORKER  # replaced only by fault-injection fakes in tests


def reproduce(model: str | os.PathLike[str], out: str | os.PathLike[str], opts: ReproOptions,
              progress: Progress | None = None) -> ReproReport:
    """Build ``model`` with each toolkit version, reduce the failure, write the artifact folder
    (``rkpart repro``); ``opts`` says how.

    Parameters
    ----------
    model
        An ONNX model or plan stage with static shapes.
    out
        Artifact folder; must be empty or absent unless ``opts.force`` (which keeps the outcome cache).
    opts.versions
        Toolkit versions (installed with ``rkpart toolkit install``) or python paths.
    opts.fail_regex
        A build "fails" iff this regex matches its log; default: a failed build, and for the
        reduction the same signal/exit code (and known signature) as the reference build.
    opts.max_time
        Time budget of the reduction in seconds.
    opts.build_timeout
        Seconds per build (matrix and candidates); default: none for the matrix, and
        ``max(60, 5 x the reference build)`` for candidates.
    opts.reduce_with
        The failing version to reduce against (default: the first failing one in ``versions``).
    Raises
    ------
    ToolkitError, InvalidModelError, OutputExistsError, UserError, ReductionError
    """
    say = progress or (lambda _m: None)
    model = Path(model)
    out = Path(out)
    versions, target, config, reduce_with = opts.versions, opts.target, opts.config, opts.reduce_with
    regex = _compile_regex(opts.fail_regex)
    if not versions:
        raise UserError("no toolkit versions given; pass e.g. --toolkits 2.3.0,2.3.2,2.5.0")
    if len(set(versions)) != len(versions):
        raise UserError(f"toolkit versions repeat: {', '.join(versions)}")
    toolkits = [find_toolkit(v, opts.toolkits_dir) for v in versions]
    by_spec = dict(zip(versions, toolkits, strict=True))
    if reduce_with is not None and reduce_with not in by_spec:
        raise UserError(f"--reduce-with {reduce_with} is not one of --toolkits ({', '.join(versions)})")
    mg = load_model(model)  # validates the model (static shapes, references) before any build
    check_target(target)  # and the settings, once, before any build
    check_config({**dict(config), "target_platform": target}, toolkits, opts.worker)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputExistsError(f"{out} exists and is not a folder (or is a symlink)")
    with folder_lock(out, what=f"repro folder {out}", nofollow=True):
        # the lock first: a second repro must not delete a running one's files
        _prepare_folder(out, opts.force)
        t0 = time.monotonic()
        say(f"building {model.name} ({len(mg.ops)} ops) with rknn-toolkit2 "
            f"{', '.join(t.version for t in toolkits)}, one at a time")
        build = BuildSettings(target, config, opts.build_timeout, opts.worker)
        original = build_matrix(model, toolkits, build, fail_regex=regex, folder=out,
                                log_prefix=f"{LOG_DIR}/original", num_nodes=mg.num_ops, progress=say)
        say(f"verdict: {original.verdict()}")
        failing = [v for v in versions if by_spec[v].version in original.failing]
        reduce_spec = reduce_with or (failing[0] if failing else None)
        reduction: Reduction | None = None
        reduced: Matrix | None = None
        signature: KnownIssue | None = None
        problem: ReductionError | None = None
        try:
            if reduce_spec is not None:
                row = original.row(by_spec[reduce_spec].version)
                if not row.failed:
                    raise ReductionError(f"rknn-toolkit2 {row.version} builds {model.name} ({row.outcome}); "
                                         f"nothing to reduce against it")
                signature = find_signature(row.signature) if row.signature else None
                if opts.reduce:
                    remaining = max(0.0, opts.max_time - (time.monotonic() - t0))
                    reduction, reduced = _reduce_and_write(model, out, by_spec[reduce_spec], row, toolkits, opts,
                                                           regex=regex, max_time=remaining, say=say)
        except ReductionError as e:
            problem = e  # the matrix is still worth writing down
        report = ReproReport(folder=out, original=original, reduced=reduced, reduction=reduction,
                             reduce_version=by_spec[reduce_spec].version if reduce_spec else None,
                             signature=signature)
        matrix_json = json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(out / "matrix.json", matrix_json.encode())
        atomic_write_bytes(out / "README.md", render_readme(report, toolkits, target=target, config=config,
                                                            fail_regex=opts.fail_regex).encode())
    if problem is not None:
        raise problem
    return report


def _reduce_and_write(model: Path, out: Path, tk: Toolkit, row: MatrixRow, toolkits: Sequence[Toolkit],
                      opts: ReproOptions, *, regex: re.Pattern[str] | None, max_time: float,
                      say: Progress) -> tuple[Reduction, Matrix]:
    """Reduce against ``tk``, then write reduced.onnx, its matrix's logs and repro.py."""
    target, config = opts.target, opts.config
    timeout = opts.build_timeout or max(60.0, 5 * row.wall_s)
    reduction = reduce_graph(model, tk, FailureSpec.from_row(row, opts.fail_regex),
                             BuildSettings(target, config, timeout, opts.worker), work=out / WORK_DIR,
                             max_time=max_time, progress=say)
    data = reduction.model.SerializeToString(deterministic=True)
    atomic_write_bytes(out / REDUCED_NAME, data)
    reduced = build_matrix(out / REDUCED_NAME, toolkits, BuildSettings(target, config, opts.build_timeout, opts.worker),
                           fail_regex=regex, folder=out, log_prefix=f"{LOG_DIR}/reduced",
                           num_nodes=reduction.candidate.num_nodes, progress=say)
    say(f"reduced graph verdict: {reduced.verdict()}")
    row_r = reduced.row(tk.version)
    script = render_script(
        data, model_file=REDUCED_NAME, num_nodes=reduction.candidate.num_nodes,
        headline=f"rknn-toolkit2 {tk.version}: {row_r.outcome} in RKNN.build() on a "
                 f"{reduction.candidate.num_nodes}-node graph",
        config={**dict(config), "target_platform": target},
        expected=[(r.version, r.outcome) for r in reduced.rows],
        expect_status=_expect_status(row_r.exit_code, row_r.signal, tk.version))
    atomic_write_bytes(out / SCRIPT_NAME, script.encode())
    os.chmod(out / SCRIPT_NAME, 0o755)
    atomic_write_bytes(out / WORK_DIR / "reduction.json",
                       (json.dumps(reduction.to_json(), indent=2, sort_keys=True) + "\n").encode())
    for scratch in ("candidate.onnx", "candidate.log"):
        (out / WORK_DIR / scratch).unlink(missing_ok=True)
    return reduction, reduced


def _compile_regex(fail_regex: str | None) -> re.Pattern[str] | None:
    if fail_regex is None:
        return None
    try:
        return re.compile(fail_regex)
    except re.error as e:
        raise UserError(f"--fail-regex {fail_regex!r} is not a valid regular expression: {e}") from None


def _prepare_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a folder")
    if not out.exists():
        return
    stale = [p for p in out.iterdir() if p.name not in (WORK_DIR, ".rkpart.lock")]
    if stale and not force:
        raise OutputExistsError(f"{out} is not empty; pass --force to replace its artifacts "
                                f"(the reduction cache in {WORK_DIR}/ is kept)")
    why = _not_repro_folder(out) if stale else None
    if why is not None:
        raise OutputExistsError(f"refusing to replace {out}: it is not an rkpart repro folder: {why}")
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


#: what ``rkpart repro`` writes into its folder
REPRO_ENTRIES = frozenset({"matrix.json", "README.md", REDUCED_NAME, SCRIPT_NAME, LOG_DIR, WORK_DIR, ".rkpart.lock"})


def _not_repro_folder(out: Path) -> str | None:
    """Why ``out`` is not a folder ``repro --force`` may empty, or ``None``."""
    for p in out.iterdir():
        if p.is_symlink():
            return f"{p.name} is a symlink"
        if p.name not in REPRO_ENTRIES and not (p.name.startswith(".") and p.name.endswith(".tmp")):
            return f"it holds {p.name!r}, which rkpart did not write"
    if (out / "matrix.json").exists():
        try:
            data = MATRIX_KIND.load(out / "matrix.json", root=out)
        except UserError as e:
            return str(e)
        if not isinstance(data, dict):
            return "its matrix.json is not a JSON object"
    return None


def _expect_status(exit_code: int | None, signal: str | None, version: str) -> str:
    if signal:
        return f"{exit_code} ({signal}) with rknn-toolkit2 {version}"
    return f"{exit_code} with rknn-toolkit2 {version}"


def _venv_python_version(tk: Toolkit) -> str:
    cfg = Path(tk.python).parent.parent / "pyvenv.cfg"
    try:
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return value.strip()
    except OSError:
        pass
    return "unknown"


def _describe_graph(model: onnx.ModelProto) -> list[str]:
    def dims(vi: onnx.ValueInfoProto) -> str:
        dtype, shape = value_type(vi)
        return f"{dtype}[{','.join(map(str, shape))}]"

    g = model.graph
    inits = {i.name: list(i.dims) for i in g.initializer}
    lines = [f"- input `{vi.name}`: {dims(vi)}" for vi in g.input]
    for n in g.node:
        ins = ", ".join(f"`{t}`" + (f" (weight {inits[t]})" if t in inits else "") for t in n.input if t)
        lines.append(f"- `{n.op_type}` `{n.name}`: {ins} -> {', '.join(f'`{t}`' for t in n.output if t)}")
    lines += [f"- output `{vi.name}`: {dims(vi)}" for vi in g.output]
    return lines


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    # drop the native pass bookkeeping, which says nothing about the failure
    keep = [ln for ln in lines if "SubgraphManager" not in ln and "AddSecondaryNode" not in ln]
    return "\n".join(ln[:200] for ln in keep[-n:])


def render_readme(report: ReproReport, toolkits: Sequence[Toolkit], *, target: str,
                  config: JsonMap | None, fail_regex: str | None) -> str:
    """The bug-report text of the artifact folder."""
    o, red, r = report.original, report.reduced, report.reduction
    v = report.reduce_version
    out: list[str] = []
    if red is not None and r is not None and v is not None:
        row = red.row(v)
        out.append(f"# rknn-toolkit2 {v}: {row.outcome} in RKNN.build() on a {r.candidate.num_nodes}-node ONNX graph")
        out += ["", "## Summary", "",
                f"Building the attached {r.candidate.num_nodes}-node ONNX graph (`{REDUCED_NAME}`, reduced "
                f"automatically from `{o.model}`, {o.num_nodes} nodes) for `{target}` in fp16 with rknn-toolkit2 "
                f"{v} ends in **{row.outcome}**"
                + (f" (last optimiser step `{row.last_step}`)" if row.last_step else "") + ".",
                "", f"Across versions: {red.verdict()}."]
    else:
        out += [f"# rknn-toolkit2 build matrix for `{o.model}`", "", "## Summary", "", f"{o.verdict()}."]
    if report.signature is not None:
        s = report.signature
        out += ["", f"Known issue `{s.id}`: {s.summary}.", "", s.details, "", f"Workaround: {s.workaround}."]
    cfg = {**dict(config or {}), "target_platform": target}
    out += ["", "## Environment", "",
            f"- host: {platform.system()} {platform.machine()}",
            f"- RKNN.config: `{json.dumps(cfg, sort_keys=True)}`; `build(do_quantization=False)` (fp16)"]
    out += [f"- rknn-toolkit2 {t.version}: Python {_venv_python_version(t)}" for t in
            sorted(toolkits, key=lambda t: version_key(t.version))]
    if fail_regex is not None:
        out.append(f"- failure criterion: build log matches `/{fail_regex}/`")
    if red is not None and v is not None:
        row = red.row(v)
        out += ["", "## Steps to reproduce", "", "```sh",
                f"pip install rknn-toolkit2=={v}   # plus its dependencies",
                f"python {SCRIPT_NAME}; echo $?", "```", "",
                f"Expected: {_expect_status(row.exit_code, row.signal, v)}. "
                f"`{SCRIPT_NAME}` embeds the model and uses only `RKNN()`, `config`, `load_onnx`, `build`, "
                f"`export_rknn`."]
        out += ["", f"## Build matrix, reduced graph ({red.num_nodes} nodes)", "", red.format_table(markdown=True)]
    out += ["", f"## Build matrix, original model `{o.model}` ({o.num_nodes} nodes)", "", o.format_table(markdown=True),
            "", f"Verdict: {o.verdict()}."]
    if red is not None and r is not None and v is not None:
        g = onnx.load_from_string(r.model.SerializeToString())
        out += ["", "## Reduced graph", "", *_describe_graph(g)]
        out += ["", f"## End of the build log ({v})", "", "```", _log_tail(report.folder / red.row(v).log), "```"]
        state = "converged" if r.complete else "stopped by the time budget (may not be minimal)"
        out += ["", "## How this was produced", "",
                f"`rkpart repro` built the model with each version in its own process, then delta-debugged it "
                f"against {v} (bisect, then removing nodes one at a time) looking for {r.spec.describe()}: "
                f"{r.original_nodes} -> {r.candidate.num_nodes} nodes in {r.builds} builds "
                f"({r.cache_hits} cached), {r.wall_s:.0f} s, {state}."]
    return "\n".join(out) + "\n"

