"""A world of every file rkpart reads, made by rkpart itself, and the commands that read them.

The generated hostile suite (``test_generated_hostile.py``, ``scripts/hostile_suite.py``) derives
its cases from here instead of listing files by hand:

* :func:`make_world` runs real rkpart commands in a fresh folder (partition the bundled example,
  calibrate it, profile it, fit a cost model, run it, bundle a host-only copy...), and records
  through :func:`rkpart.readers.tracing` which file of which kind every *reading* command
  (:data:`ROUTES`) opened.  A kind a command reads becomes a route: its file, mutated, is given to
  that command again.
* :data:`SAMPLES` makes a valid file for a kind no command of the world reads without a toolkit
  (a layer table, a build log, a repro matrix...), with rkpart's own writers where it has one;
  every registered kind must be traced or sampled (checked).
* :data:`MUTATIONS` are the hostile variants of a file: FIFO, device, symlink out, ``../``,
  truncated, huge, nested, not UTF-8, and NaN / Inf / 0 / negative / 1e308 in every number.

Everything runs in-process (click's ``CliRunner``), each case in a thread with a timeout, so a
read that blocks fails its case instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import Result

from tests.hostile.models import HOST_SPEC, cli

#: the documented exit codes of rkpart (docs/errors.md) a hostile case may end with
EXIT_CODES = frozenset({0, 2, 3, 4, 5, 6, 7, 8, 9, 10})
#: a case that takes longer than this hangs (every refusal happens before any work)
CASE_TIMEOUT = 60.0


# -- the world --------------------------------------------------------------------------------------------


@dataclass
class Route:
    """A command of the world that reads files, and what it read (kind -> paths relative to the world)."""

    name: str
    argv: list[str]  # "{w}" stands for the world folder
    ok: frozenset[int]  # its exit codes on the world as made (7: a toolkit the world does not install)
    outputs: tuple[str, ...] = ()  # what it writes, relative to the world (removed between cases)
    reads: dict[str, list[str]] = field(default_factory=dict)

    def args(self, world: Path) -> list[str]:
        return [a.replace("{w}", str(world)) for a in self.argv]


#: the reading commands, in the order they run (each must succeed on the world: ``ok``)
ROUTES: list[Route] = [
    Route("estimate", ["estimate", "{w}/plan", "--cost-model", "{w}/m.json", "--json"], frozenset({0})),
    Route("profile-show", ["profile", "--show", "{w}/p.jsonl", "--against", "{w}/m.json"], frozenset({0})),
    Route("fit", ["fit", "{w}/p.jsonl", "--base", "{w}/m.json", "--mix-backends", "-o", "{w}/out/fit.json"],
          frozenset({0}),
          ("out/fit.json",)),
    # --model: with --reference alone, run never reads the whole model
    Route("run", ["run", "{w}/plan", "--inputs", "{w}/in.npz", "--reference", "{w}/ref.npz",
                  "--model", "{w}/model.onnx", "-q"], frozenset({0})),
    Route("partition-custom", ["partition", "{w}/model.onnx", "-s", "custom", "--spec", "{w}/host.yaml",
                               "-o", "{w}/out/custom", "-q"], frozenset({0}), ("out/custom",)),
    Route("partition-learned", ["partition", "{w}/model.onnx", "--toolkit", "2.5.0", "-o", "{w}/out/learned", "-q"],
          frozenset({0}), ("out/learned",)),
    Route("partition-auto", ["partition", "{w}/model.onnx", "-s", "auto", "--cost-model", "{w}/m.json",
                             "--accuracy", "{w}/acc.json", "-o", "{w}/out/auto", "-q"], frozenset({0}), ("out/auto",)),
    # the calibration is read and verified before any toolkit work: 7 is the missing toolkit 9.9.9
    Route("compile-int8", ["compile", "{w}/plan", "--toolkit", "9.9.9", "--precision", "int8",
                           "--calibration", "{w}/calib", "--precision-spec", "{w}/prec.yaml", "-q"], frozenset({7})),
    Route("report", ["report", "{w}/plan", "{w}/p.jsonl", "--run", "{w}/run.json", "--cost-model", "{w}/m.json",
                     "-o", "{w}/out/r.html", "-q"], frozenset({0}), ("out/r.html", "out/r_files")),
    Route("calibrate-force", ["calibrate", "{w}/plan", "-o", "{w}/calib-legacy", "--force", "--samples", "2",
                              "--steps", "1", "-q"], frozenset({0}), ()),
]


def _learned_store(cache: Path) -> None:
    """A learned-placement store written by rkpart's own :func:`rkpart.grouping.learned.learn`."""
    from rkpart.grouping.learned import CpuLayer, learn
    from rkpart.targets.capability import PlacementPattern

    p = PlacementPattern("IsNaN", "float32", (4,), dims="1nnn>1nnn")
    learn("rk3588", "2.5.0", [CpuLayer("b00.attn", "IsNaN:n1", "n1", p)], root=cache)


@contextlib.contextmanager
def cache_env(world: Path) -> Iterator[None]:
    """``$RKPART_CACHE_DIR`` is the world's own cache folder while active."""
    old = os.environ.get("RKPART_CACHE_DIR")
    os.environ["RKPART_CACHE_DIR"] = str(world / "cache")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RKPART_CACHE_DIR", None)
        else:
            os.environ["RKPART_CACHE_DIR"] = old


def _legacy_calibration(w: Path) -> None:
    """A calibration folder as an older rkpart wrote it (no marker): ``calibrate --force`` reads its
    manifest, ``dataset.txt`` files and samples to list what it may replace."""
    shutil.rmtree(w / "calib-legacy", ignore_errors=True)
    shutil.copytree(w / "calib", w / "calib-legacy")
    (w / "calib-legacy" / ".rkpart-output.json").unlink()


def make_world(root: Path, example: Path) -> tuple[Path, list[Route]]:
    """Make the world in ``root/world`` (see the module doc) and return it with its routes, each
    holding what it read."""
    w = root / "world"
    w.mkdir()
    with cache_env(w):
        return w, _make(w, example)


def _make(w: Path, example: Path) -> list[Route]:
    shutil.copy(example, w / "model.onnx")
    (w / "host.yaml").write_text(HOST_SPEC)
    (w / "prec.yaml").write_text("default: int8\n")
    (w / "out").mkdir()

    def ok(args: list[Any]) -> None:
        r = cli(args)
        assert r.exit_code == 0, (args, r.output)

    ok(["partition", w / "model.onnx", "-s", "split", "-o", w / "plan", "-q"])
    ok(["calibrate", w / "plan", "-o", w / "calib", "--samples", "2", "--steps", "1", "-q"])
    ok(["profile", w / "plan", "--rounds", "1", "--warmup", "0", "--threads", "1", "-o", w / "p.jsonl", "-q"])
    ok(["fit", w / "p.jsonl", "--base", _shipped(), "--mix-backends", "-o", w / "m.json"])
    from rkpart.plan.plan import load_plan
    from rkpart.runtime.executor import random_inputs

    plan, _ = load_plan(w / "plan")
    np.savez(w / "in.npz", **random_inputs(plan.tensors, plan.inputs, 0))
    ok(["run", w / "plan", "--inputs", w / "in.npz", "--save-outputs", w / "ref.npz", "-q"])
    r = cli(["run", w / "plan", "--per-stage", "--json", "-q"])
    assert r.exit_code == 0, r.output
    (w / "run.json").write_text(r.stdout)
    # the accuracy term `drift --accuracy` writes, as the shipped calibration carries one
    (w / "acc.json").write_text(json.dumps(json.loads(_shipped().read_text())["accuracy"], indent=2))
    _legacy_calibration(w)
    _learned_store(w / "cache")
    ok(["partition", w / "model.onnx", "-s", "custom", "--spec", w / "host.yaml", "-o", w / "hplan", "-q"])
    ok(["bundle", w / "hplan", "-o", w / "bundle", "-q"])
    routes = []
    from rkpart.readers import tracing

    for proto in ROUTES:
        route = Route(proto.name, list(proto.argv), proto.ok, proto.outputs)
        with tracing() as seen:
            r = invoke(route.args(w))
        assert r.exit_code in route.ok, (route.name, r.exit_code, r.output)
        for kind, path in seen:
            with contextlib.suppress(ValueError):
                rel = path.relative_to(w).as_posix()
                if rel.split("/", 1)[0] not in ("out", "cache") or kind == "learned-placement store":
                    route.reads.setdefault(kind, [])
                    if rel not in route.reads[kind]:
                        route.reads[kind].append(rel)
        clean_outputs(w, route)
        routes.append(route)
    _legacy_calibration(w)  # calibrate --force replaced it
    return routes


def _shipped() -> Path:
    from rkpart.cost_model.model import default_model_path

    return default_model_path()


def clean_outputs(world: Path, route: Route) -> None:
    """Remove what ``route`` wrote into the world (its outputs and their staging leftovers)."""
    for rel in route.outputs:
        p = world / rel
        for q in (p, p.with_name(f".{p.name}.partial"), p.with_name(f".{p.name}.old")):
            if q.is_symlink() or q.is_file():
                q.unlink()
            elif q.is_dir():
                shutil.rmtree(q)


# -- running one case ----------------------------------------------------------------------------------


def invoke(args: list[Any], timeout: float = CASE_TIMEOUT) -> Result:
    """``rkpart ARGS`` in-process, in a thread: a read that blocks fails instead of hanging."""
    done: list[Result] = []
    t = threading.Thread(target=lambda: done.append(cli(args)), daemon=True)
    t.start()
    t.join(timeout=timeout)
    if not done:
        raise TimeoutError(f"no answer within {timeout:.0f} s: rkpart {' '.join(map(str, args))}")
    return done[0]


def snapshot(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every entry under ``folder`` -> its kind and content digest (symlinks by their target, never
    followed; FIFOs and devices by their kind: never opened)."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(folder, followlinks=False):
        for n in [*files, *dirs]:
            p = Path(dirpath) / n
            rel = p.relative_to(folder).as_posix()
            if any(rel == s or rel.startswith(s + "/") for s in skip):
                continue
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    while buf := f.read(1 << 20):
                        h.update(buf)
                out[rel] = h.hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = f"mode:{stat.S_IFMT(st.st_mode)}"
    return out


@dataclass(frozen=True)
class Outcome:
    """What one case did, judged against the rules of issue 51 (``breaks`` empty: it held)."""

    case: str
    exit_code: int | None
    message: str
    seconds: float
    breaks: tuple[str, ...]


def judge(case: str, r: Result | BaseException, seconds: float, *, allowed: frozenset[int] = EXIT_CODES,
          must_refuse: bool = False, refused: frozenset[int] | None = None) -> Outcome:
    """The breaks of one CLI case: a hang, a traceback (an exception that is not a clean exit), an exit
    code docs/errors.md does not list (or, ``must_refuse``, success; ``refused``: the codes a refusal
    must use), an error that is not one line of at most 480 characters."""
    from rkpart.errors import MAX_MESSAGE

    if isinstance(r, BaseException):
        return Outcome(case, None, "", seconds, (f"{type(r).__name__}: {r}",))
    breaks = []
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        breaks.append(f"traceback: {type(r.exception).__name__}: {str(r.exception)[:200]}")
    if "Traceback" in r.output:
        breaks.append("a traceback was printed")
    if r.exit_code not in allowed:
        breaks.append(f"exit {r.exit_code}, not one of {sorted(allowed)}")
    if must_refuse and r.exit_code == 0:
        breaks.append("accepted")
    if refused is not None and r.exit_code != 0 and r.exit_code not in refused and r.exit_code in EXIT_CODES:
        breaks.append(f"refused with exit {r.exit_code}, not {sorted(refused)}")
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("rkpart: error")]
    msg = lines[0] if lines else ""
    if r.exit_code not in (0, None) and r.exit_code in EXIT_CODES - {0}:
        if len(lines) != 1:
            breaks.append(f"{len(lines)} error lines")
        elif len(msg) > MAX_MESSAGE + len("rkpart: error: "):
            breaks.append(f"an error of {len(msg)} characters")
    return Outcome(case, r.exit_code, msg, seconds, tuple(breaks))


# -- hostile variants of one file ------------------------------------------------------------------------

Mutate = Callable[[Path, Path], Path | None]  # (the file, a scratch folder outside the world) -> path to read


def _fifo(p: Path, _: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _device(p: Path, _: Path) -> None:
    p.unlink()
    os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers: a read never ends


def make_socket(p: Path) -> None:
    """A listening-less Unix socket at ``p`` (bound from its folder: a socket path is at most 107 bytes)."""
    import socket

    old = os.getcwd()
    os.chdir(p.parent)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(p.name)
        s.close()  # the socket file stays
    finally:
        os.chdir(old)


def _socket(p: Path, _: Path) -> None:
    p.unlink()
    make_socket(p)


def _devzero(p: Path, _: Path) -> None:
    p.unlink()
    p.symlink_to("/dev/zero")


def _symlink_out(p: Path, scratch: Path) -> None:
    out = scratch / f"outside-{p.name}"
    shutil.copy(p, out)
    p.unlink()
    p.symlink_to(out)


def _symlink_in(p: Path, _: Path) -> None:
    twin = p.with_name(f"twin-{p.name}")
    shutil.copy(p, twin)
    p.unlink()
    p.symlink_to(twin.name)


def _folder(p: Path, _: Path) -> None:
    p.unlink()
    p.mkdir()


def _huge(p: Path, _: Path) -> None:
    with open(p, "r+b") as f:
        f.truncate(max(p.stat().st_size, 1) + (5 << 40))  # sparse: 5 TiB of nothing, never read


def _empty(p: Path, _: Path) -> None:
    p.write_bytes(b"")


def _truncated(p: Path, _: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _garbage(p: Path, _: Path) -> None:
    p.write_bytes(b"\x00\x01\x02 not this kind of file \xff" * 64)


def _not_utf8(p: Path, _: Path) -> None:
    p.write_bytes(b"\xff\xfe\x00" + p.read_bytes()[:64])


def _deep(p: Path, _: Path) -> None:
    p.write_bytes(b"[" * 200_000 + b"]" * 200_000)


def _deep_object(p: Path, _: Path) -> None:
    p.write_bytes(b'{"a":' * 300 + b"1" + b"}" * 300)


def _digits(p: Path, _: Path) -> None:
    p.write_bytes(b'{"format": ' + b"7" * 5000 + b"}")


def _wrong_type(p: Path, _: Path) -> None:
    p.write_bytes(b"[1, 2, 3]\n")


def _npy_int64(p: Path, _: Path) -> None:
    a = np.load(p)
    np.save(p, np.zeros(a.shape, dtype=np.int64), allow_pickle=False)


def _npy_shape(p: Path, _: Path) -> None:
    a = np.load(p)
    np.save(p, np.zeros((*a.shape, 2), dtype=a.dtype), allow_pickle=False)


def _npy_pickled(p: Path, _: Path) -> None:
    np.save(p, np.array([{}], dtype=object), allow_pickle=True)


def _npy_huge_header(p: Path, _: Path) -> None:
    import io

    hdr = io.BytesIO()
    np.lib.format.write_array_header_2_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    p.write_bytes(hdr.getvalue() + b"\x00" * 16)


def _npz_pickled(p: Path, _: Path) -> None:
    with np.load(p) as z:
        names = list(z.files)
    np.savez(p, **{n: np.array([{}], dtype=object) for n in names})
    _rename_npz(p)


def _npz_int64(p: Path, _: Path) -> None:
    with np.load(p) as z:
        arrays = {n: np.zeros(z[n].shape, dtype=np.int64) for n in z.files}
    np.savez(p, **arrays)
    _rename_npz(p)


def _npz_shape(p: Path, _: Path) -> None:
    with np.load(p) as z:
        arrays = {n: np.zeros((*z[n].shape, 3), dtype=z[n].dtype) for n in z.files}
    np.savez(p, **arrays)
    _rename_npz(p)


def _npz_nan(p: Path, _: Path) -> None:
    with np.load(p) as z:
        arrays = {n: np.full(z[n].shape, np.nan, dtype=z[n].dtype) if z[n].dtype.kind == "f" else z[n]
                  for n in z.files}
    np.savez(p, **arrays)
    _rename_npz(p)


def _rename_npz(p: Path) -> None:
    """``np.savez`` adds ``.npz`` to a name without it."""
    made = p.with_name(p.name + ".npz")
    if made.exists() and not p.name.endswith(".npz"):
        os.replace(made, p)


#: mutations of any file: (name, mutate, whether it must be refused)
FILE_MUTATIONS: list[tuple[str, Mutate, bool]] = [
    ("fifo", _fifo, True), ("device", _device, True), ("devzero", _devzero, True), ("socket", _socket, True),
    ("symlink-out", _symlink_out, True), ("folder", _folder, True), ("huge", _huge, True),
    ("empty", _empty, False), ("truncated", _truncated, False), ("garbage", _garbage, False),
    ("symlink-in", _symlink_in, False),
]
#: mutations of JSON / JSON Lines / YAML documents
DOC_MUTATIONS: list[tuple[str, Mutate, bool]] = [
    ("not-utf8", _not_utf8, True), ("deep", _deep, True), ("deep-object", _deep_object, True),
    ("digits", _digits, True), ("wrong-type", _wrong_type, False),
]
NPY_MUTATIONS: list[tuple[str, Mutate, bool]] = [
    ("int64", _npy_int64, False), ("shape", _npy_shape, False), ("pickled", _npy_pickled, True),
    ("huge-header", _npy_huge_header, True),
]
NPZ_MUTATIONS: list[tuple[str, Mutate, bool]] = [
    ("pickled", _npz_pickled, True), ("int64", _npz_int64, False), ("shape", _npz_shape, False),
    ("nan", _npz_nan, False),
]
#: what replaces a number in :func:`number_mutations`
NUMBERS: list[tuple[str, str]] = [("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity"), ("zero", "0"),
                                  ("negative", "-1"), ("1e308", "1e308")]


def mutations(fmt: str) -> list[tuple[str, Mutate, bool]]:
    """The variants for a file of the format ``fmt`` (a :data:`rkpart.readers.Format`)."""
    extra = {"json": DOC_MUTATIONS, "jsonl": DOC_MUTATIONS[:1], "yaml": DOC_MUTATIONS[:1], "text": DOC_MUTATIONS[:1],
             "npy": NPY_MUTATIONS, "npz": NPZ_MUTATIONS}.get(fmt, [])
    return [*FILE_MUTATIONS, *extra]


def number_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path (keys and indices) of every number in a parsed JSON document, in document order."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from number_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from number_paths(v, (*prefix, i))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield prefix


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    import copy

    out = copy.deepcopy(doc)
    cur = out
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return out


def number_mutations(p: Path, fmt: str, limit: int | None = None) -> list[tuple[str, Callable[[Path], None]]]:
    """One variant per number of the JSON (or, JSON Lines: first record's) document at ``p`` and per
    value of :data:`NUMBERS`: ``(name, write it to a path)``; ``limit``: at most that many numbers,
    spread evenly over the document."""
    text = p.read_text()
    lines = text.splitlines()
    doc = json.loads(lines[0] if fmt == "jsonl" else text)
    paths = list(number_paths(doc))
    if limit is not None and len(paths) > limit:
        step = len(paths) / limit
        paths = [paths[math.floor(i * step)] for i in range(limit)]
    out = []
    for path in paths:
        for name, literal in NUMBERS:
            value = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(literal, float(literal))
            body = json.dumps(_set(doc, path, value))
            data = "\n".join([body, *lines[1:]]) + "\n" if fmt == "jsonl" else body

            def write(q: Path, data: str = data) -> None:
                q.write_text(data)

            out.append((f"{'.'.join(map(str, path))[:80]}={name}", write))
    return out


#: a string that names a file: what a plan, a manifest, a calibration or a record holds as a path
_FILE_NAME = re.compile(r"^[^\s]{1,300}\.(onnx|data|npy|npz|json|jsonl|txt|rknn|log|yaml|html)$")


def string_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path (keys and indices) of every string of a parsed JSON document that names a file."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from string_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from string_paths(v, (*prefix, i))
    elif isinstance(doc, str) and _FILE_NAME.match(doc):
        yield prefix


def path_mutations(p: Path, fmt: str, limit: int | None = None) -> list[tuple[str, Mutate]]:
    """Every file a document names (a JSON string naming a file; the first line of a text list),
    pointed out of its folder: at a valid copy of that file (``../`` up to the scratch folder, and
    absolute), at a FIFO and at ``/dev/zero``.  A reader that follows the name unchecked reads the
    copy (:func:`opened` sees it), blocks or reads forever (the case's timeout calls it a hang)
    instead of refusing in one line.  ``limit``: at most that many names of a document, spread
    evenly over it."""
    text = p.read_text(errors="replace")
    lines = text.splitlines()
    doc: Any = None
    if fmt == "text":
        targets: list[tuple[Any, ...]] = [()] if lines and _FILE_NAME.match(lines[0].strip()) else []
    else:
        try:
            doc = json.loads(lines[0] if fmt == "jsonl" else text)
        except (ValueError, IndexError):
            return []
        targets = list(string_paths(doc))
    if limit is not None and len(targets) > limit:
        step = len(targets) / limit
        targets = [targets[math.floor(i * step)] for i in range(limit)]
    out: list[tuple[str, Mutate]] = []
    for path in targets:
        for name in ("up-copy", "abs-copy", "abs-fifo", "abs-devzero"):
            def mutate(q: Path, outside: Path, path: tuple[Any, ...] = path, name: str = name) -> None:
                old = lines[0].strip() if fmt == "text" else _get(doc, path)
                if name == "abs-devzero":
                    value = "/dev/zero"
                elif name == "abs-fifo":
                    value = str(outside / "planted.fifo")
                    os.mkfifo(value)
                else:
                    src = q.parent / old
                    planted = outside / "planted" / Path(old).name
                    planted.parent.mkdir(exist_ok=True)
                    if src.is_file() and not src.is_symlink():
                        shutil.copy(src, planted)
                    else:
                        planted.write_bytes(b"planted")
                    value = str(planted) if name == "abs-copy" else os.path.relpath(planted, q.parent)
                if fmt == "text":
                    q.write_text("\n".join([value, *lines[1:]]) + "\n")
                    return
                body = json.dumps(_set(doc, path, value))
                q.write_text("\n".join([body, *lines[1:]]) + "\n" if fmt == "jsonl" else body)

            out.append((f"{'.'.join(map(str, path))[:80] or 'line1'}={name}", mutate))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


#: while :func:`opened` is active: every path this process opens (the ``open`` audit event: ``open()``,
#: ``os.open``, ``io.open``; a toolkit's subprocess is not seen)
_OPENED: list[list[str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENED and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED[-1].append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # once per process (hooks cannot be removed); records only while opened() is active


@contextlib.contextmanager
def opened() -> Iterator[list[str]]:
    """The paths opened in this process while active (any thread)."""
    got: list[str] = []
    _OPENED.append(got)
    try:
        yield got
    finally:
        _OPENED.remove(got)


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    got: list[float] = []
    t0 = time.monotonic()
    try:
        yield got
    finally:
        got.append(time.monotonic() - t0)
