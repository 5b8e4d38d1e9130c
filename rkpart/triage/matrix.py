"""Build one model with several rknn-toolkit2 versions, each in isolation, and tabulate the outcomes.

Every build goes through :func:`rkpart.compile.runner.run_build`: its own subprocess of the
version's venv python, own process group and disposable HOME, so a SIGSEGV in one version is
just a row of the table.  Builds run one after the other: the matrix measures build time and
peak RSS, which parallel builds would distort.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rkpart.compile.hang import cpu_limit as hang_cpu_limit
from rkpart.compile.runner import WORKER, BuildJob, BuildResult, run_build
from rkpart.compile.toolkits import Toolkit
from rkpart.progress import Progress, advance
from rkpart.targets.known_issues import match_signature
from rkpart.types import JsonMap, JsonObject
from rkpart.units import human_bytes


def version_key(v: str) -> tuple[int | str, ...]:
    """Sort key for toolkit versions (``2.3.0 < 2.3.2 < 2.5.0 < 2.10.0``)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", v))


def build_once(onnx: Path, toolkit: Toolkit, *, target: str, config: JsonMap | None = None,
               log: Path, timeout: float | None = None, label: str = "triage",
               tmp_parent: Path | None = None, worker: Path = WORKER, cpu_limit: float | None = None) -> BuildResult:
    """Build ``onnx`` once with ``toolkit`` in a crash-isolated subprocess; the .rknn is discarded.

    The build log is kept at ``log`` (signatures and ``--fail-regex`` are matched against it).
    ``cpu_limit``: CPU seconds of the build's process tree past which it is stopped as a hang (a
    ``timeout``), besides ``timeout``'s wall seconds.  ``worker`` is replaced only by fault-injection
    fakes in tests.
    """
    work = Path(tempfile.mkdtemp(prefix="rkpart-triage-", dir=tmp_parent))
    try:
        job = BuildJob(stage_id=label, onnx=Path(onnx), output=work / "out.rknn", log=Path(log),
                       config={**dict(config or {}), "target_platform": target}, toolkit=toolkit,
                       timeout=timeout, worker=worker, watch=None if cpu_limit is None else hang_cpu_limit(cpu_limit))
        return run_build(job, tmp_parent=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def describe_outcome(kind: str, exit_code: int | None, signal: str | None) -> str:
    """``ok (exit 0)``, ``SIGSEGV (exit 139)``, ``error (exit 3)``, ``timeout``, ``oom``."""
    if kind == "ok":
        return "ok (exit 0)"
    if signal and kind in ("crash", "oom"):
        return f"{signal} (exit {exit_code})"
    if kind == "timeout":
        return "timeout"
    return f"{kind} (exit {exit_code})"


@dataclass(frozen=True)
class MatrixRow:
    """One toolkit version's build of the model."""

    version: str
    kind: str  # as BuildResult.kind
    exit_code: int | None
    signal: str | None
    last_step: str | None
    wall_s: float
    peak_rss_bytes: int
    rknn_size: int
    signature: str | None  # id of a known failure signature
    regex_matched: bool | None  # None when no --fail-regex was given
    message: str
    log: str  # relative to the artifact folder

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def failed(self) -> bool:
        """Fails as the user defined it: the regex matched, or (without a regex) the build failed."""
        return bool(self.regex_matched) if self.regex_matched is not None else not self.ok

    @property
    def outcome(self) -> str:
        return describe_outcome(self.kind, self.exit_code, self.signal)

    def to_json(self) -> JsonObject:
        return {"version": self.version, "kind": self.kind, "outcome": self.outcome, "exit_code": self.exit_code,
                "signal": self.signal, "last_step": self.last_step, "wall_s": round(self.wall_s, 2),
                "peak_rss_bytes": self.peak_rss_bytes, "rknn_size": self.rknn_size, "signature": self.signature,
                "regex_matched": self.regex_matched, "failed": self.failed, "message": self.message,
                "log": self.log}

    @classmethod
    def from_json(cls, d: JsonMap) -> MatrixRow:
        return cls(version=str(d["version"]), kind=str(d["kind"]), exit_code=d.get("exit_code"),
                   signal=d.get("signal"), last_step=d.get("last_step"), wall_s=float(d["wall_s"]),
                   peak_rss_bytes=int(d["peak_rss_bytes"]), rknn_size=int(d.get("rknn_size", 0)),
                   signature=d.get("signature"), regex_matched=d.get("regex_matched"),
                   message=str(d.get("message", "")), log=str(d.get("log", "")))


@dataclass(frozen=True)
class Matrix:
    """Outcomes of one model across toolkit versions (rows sorted by version)."""

    model: str
    num_nodes: int
    target: str
    rows: tuple[MatrixRow, ...]

    @property
    def failing(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.rows if r.failed)

    @property
    def passing(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.rows if not r.failed)

    def row(self, version: str) -> MatrixRow:
        for r in self.rows:
            if r.version == version:
                return r
        raise KeyError(version)

    def verdict(self) -> str:
        """Regression or long-standing, in one sentence."""
        rows = self.rows
        bad = [r.version for r in rows if r.failed]
        if not bad:
            return f"builds with every tested version ({', '.join(r.version for r in rows)})"
        if len(bad) == len(rows):
            return f"long-standing: fails with every tested version ({', '.join(bad)})"
        parts = []
        for i, r in enumerate(rows):
            prev = rows[i - 1] if i else None
            if r.failed and prev is not None and not prev.failed:
                parts.append(f"regression: builds with {prev.version}, fails with {r.version}")
            elif r.failed and prev is None:
                parts.append(f"long-standing: fails with the oldest tested version {r.version}")
            elif not r.failed and prev is not None and prev.failed:
                parts.append(f"fixed in {r.version}")
        return "; ".join(parts)

    def format_table(self, markdown: bool = False) -> str:
        """The version x outcome table (plain text, or Markdown for README/bug reports)."""
        head = ("toolkit", "outcome", "last optimiser step", "build s", "peak RSS", "known issue")
        body = [(r.version, r.outcome + ("" if r.regex_matched is None else
                                          (", regex matched" if r.regex_matched else ", regex not matched")),
                 r.last_step or "-", f"{r.wall_s:.1f}", human_bytes(r.peak_rss_bytes), r.signature or "-")
                for r in self.rows]
        if markdown:
            lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
            lines += ["| " + " | ".join(row) + " |" for row in body]
            return "\n".join(lines)
        widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                         for row in (head, *body))

    def to_json(self) -> JsonObject:
        return {"model": self.model, "num_nodes": self.num_nodes, "target": self.target,
                "failing": list(self.failing), "verdict": self.verdict(), "rows": [r.to_json() for r in self.rows]}

    @classmethod
    def from_json(cls, d: JsonMap) -> Matrix:
        return cls(model=str(d["model"]), num_nodes=int(d["num_nodes"]), target=str(d["target"]),
                   rows=tuple(MatrixRow.from_json(r) for r in d["rows"]))


def row_from_result(version: str, res: BuildResult, *, fail_regex: re.Pattern[str] | None, log_rel: str) -> MatrixRow:
    """Turn a build result into a matrix row (matching signatures and the regex on its log)."""
    sig = match_signature(res)
    matched: bool | None = None
    if fail_regex is not None:
        try:
            matched = bool(fail_regex.search(Path(res.log).read_text(errors="replace")))
        except OSError:
            matched = False
    return MatrixRow(version=version, kind=res.kind, exit_code=res.exit_code, signal=res.signal,
                     last_step=res.last_step, wall_s=res.wall_s, peak_rss_bytes=res.peak_rss_bytes,
                     rknn_size=res.rknn_size, signature=sig.id if sig else None, regex_matched=matched,
                     message=res.message, log=log_rel)


@dataclass(frozen=True)
class BuildSettings:
    """How each triage build runs: ``target_platform``, further ``RKNN.config`` options, seconds per
    build (``None``: no limit), CPU seconds per build (the reduction of a hang) and the build worker
    (replaced only by fault-injection fakes)."""

    target: str = "rk3588"
    config: JsonMap = field(default_factory=dict)
    timeout: float | None = None
    worker: Path = WORKER
    cpu_limit: float | None = None


def build_matrix(model: str | Path, toolkits: Sequence[Toolkit], build: BuildSettings = BuildSettings(), *,
                 fail_regex: re.Pattern[str] | None = None, folder: Path, log_prefix: str = "logs/model",
                 num_nodes: int = 0, progress: Progress | None = None) -> Matrix:
    """Build ``model`` once per toolkit, sequentially, as ``build`` says, and return the matrix.

    Parameters
    ----------
    model
        ONNX file (external data next to it is fine).
    toolkits
        Resolved toolkits (``rkpart.compile.toolkits.find_toolkit``); rows are sorted by version.
    folder, log_prefix
        Logs go to ``folder/<log_prefix>.<version>.log``; rows store that relative path.
    fail_regex
        When given, a version "fails" iff the regex matches its build log.
    """
    say = progress or (lambda _m: None)
    rows = []
    ordered = sorted(toolkits, key=lambda t: version_key(t.version))
    for n, tk in enumerate(ordered, start=1):
        rel = f"{log_prefix}.{tk.version}.log"
        say(f"[matrix {n}/{len(ordered)}] building {Path(model).name} with rknn-toolkit2 {tk.version}")
        res = build_once(Path(model), tk, target=build.target, config=build.config, log=folder / rel,
                         timeout=build.timeout, label=f"matrix-{tk.version}", worker=build.worker)
        row = row_from_result(tk.version, res, fail_regex=fail_regex, log_rel=rel)
        say(f"[matrix {n}/{len(ordered)}] {tk.version}: {row.outcome}, last step {row.last_step or '-'}, "
            f"{row.wall_s:.1f} s, peak {human_bytes(row.peak_rss_bytes)}"
            + (f", {row.signature}" if row.signature else ""))
        advance(say, n, len(ordered))
        rows.append(row)
    return Matrix(model=Path(model).name, num_nodes=num_nodes, target=build.target, rows=tuple(rows))
