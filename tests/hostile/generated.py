"""The cases of the generated hostile suite (issue 51), shared by the tests and ``scripts/hostile_suite.py``.

* :func:`reader_cases`: every registered :class:`~rkpart.readers.FileKind` read directly through
  its reader, on every hostile variant of a valid file of that kind (:mod:`tests.hostile.world`'s
  mutations, and NaN / Inf / 0 / -1 / 1e308 in each of its numbers).  A case holds when the
  reader returns or raises the kind's own error class (its documented exit code) with one line;
  a variant that must be refused (FIFO, device, symlink out, a file over its bound, nested JSON...)
  is refused; nothing hangs (every case in a thread with a timeout).
* :func:`cli_cases`: the same variants given to the commands that read the file (the world's
  routes), in a copy of the world: the exit code is one docs/errors.md lists, an error is one
  line, no traceback, nothing written outside the command's outputs, nothing of the world lost.
* :func:`output_cases`: every output flag of every command (discovered from the click commands:
  options of type :class:`rkpart.cli_args.OutputFile` / ``OutputFolder``) and of the runner
  (``OUTPUT_FLAGS``), given hostile destinations: an input of the command, a path inside a plan,
  bundle, calibration or the cache, a user's file with and without ``--force``, rkpart's own file
  with and without ``--force``, a symlink, a FIFO, a device, a folder.

Every case is a callable returning an :class:`~tests.hostile.world.Outcome`; a sample of them runs in
the test suite, all of them from the script.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from tests.hostile import world as W

Case = tuple[str, Callable[[Path], W.Outcome]]  # (id, run it in a scratch folder)


# -- valid samples of the kinds no command of the world reads without a toolkit --------------------------------


def _sample_log(p: Path) -> None:
    p.write_text("I rknn building ...\nD RKNN: [00:00:01.000] Total Weight Memory Size: 173KB\n")


def _sample_memory(p: Path) -> None:
    from rkpart.compile.scheduler import MemoryModel

    m = MemoryModel(p)
    m.observe("2.5.0", 1 << 20, 1 << 28)
    m.save()


def _sample_cache_entry(p: Path) -> None:
    import hashlib
    import json

    p.write_text(json.dumps({"toolkit": "2.5.0", "target": "rk3588", "size_bytes": 64,
                             "sha256": hashlib.sha256(b"rknn" * 16).hexdigest()}, indent=2))


def _sample_layers(p: Path) -> None:
    from rkpart.compile.compiler_plan import LayerRow, layers_json

    p.write_bytes(layers_json([LayerRow(3, "Conv", "FLOAT16", "NPU", "(1,96,1,64)", "(1,96,1,64)", 1819, 1152, 1819,
                                        30, "Conv:/to_v/MatMul")]))


def _sample_dataset(p: Path) -> None:
    import numpy as np

    np.save(p.parent / "x0.npy", np.zeros((1, 4), np.float32))
    p.write_text("x0.npy\n")


def _sample_npy(p: Path) -> None:
    import numpy as np

    np.save(p, np.arange(8, dtype=np.float32).reshape(2, 4), allow_pickle=False)


def _sample_marker(p: Path) -> None:
    from rkpart.output import write_marker

    (p.parent / "plan.json").write_text("{}")
    write_marker(p.parent, "plan")
    if p.name != ".rkpart-output.json":
        os.replace(p.parent / ".rkpart-output.json", p)


def _sample_prepared(p: Path) -> None:
    import json

    from rkpart.compile.prepare import PREPARE_VERSION

    p.write_text(json.dumps({"version": PREPARE_VERSION, "stage_sha256": "ab" * 32, "rules": [], "drop": {},
                             "record": None}, indent=2))


def _sample_description(p: Path) -> None:
    from tests.description.docs import base_doc, flux_guidance_inputs, flux_ids, write

    assert p.name == "pipeline.json"
    write(p.parent, base_doc(flux_guidance_inputs()), flux_ids())


def _sample_verdict(p: Path) -> None:
    from rkpart.compile.weigh import Figures, VerdictStore, judge

    verdict = judge(["heads-table-layout"], Figures(0, 1 << 20, 4 << 20), Figures(0, 1 << 20, 3 << 20))
    VerdictStore._write(p.parent, p.stem, verdict)


def _json(doc: Any) -> Callable[[Path], None]:
    def write(p: Path) -> None:
        import json

        p.write_text(json.dumps(doc, indent=2))

    return write


#: kind -> (file name, write a valid file of it) for kinds :data:`tests.hostile.world.ROUTES` do not read
SAMPLES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "build log": ("b00.attn.2.5.0.log", _sample_log),
    "build memory file": ("build-memory.json", _sample_memory),
    "cache entry": ("ab" * 32 + ".json", _sample_cache_entry),
    "compiler layer table": ("layers.json", _sample_layers),
    "dataset file": ("dataset.txt", _sample_dataset),
    "dataset sample": ("x0.npy", _sample_npy),
    "output marker": (".rkpart-output.json", _sample_marker),
    "pipeline description": ("pipeline.json", _sample_description),
    "prepared-copy record": ("0123456789abcdef.2.5.0.json", _sample_prepared),
    "reduction outcomes": ("outcomes.json", _json({"ab" * 32: {"fails": True, "seconds": 1.5}})),
    "repro matrix": ("matrix.json", _json({"rows": [], "toolkits": ["2.5.0"]})),
    "resume journal": ("journal", lambda p: p.write_text('{"id": "s0"}\n')),
    "run key": ("run-key.json", _json({"key": "ab" * 32})),
    "toolkit marker": ("toolkit.json", _json({"version": "2.5.0", "python": sys.executable, "managed": False})),
    "tune report": ("tune_report.json", _json({"cost_model": "cost_model.json", "auto_plan": "plans/auto",
                                              "verify": []})),
    "weighed-rewrite verdict": ("cd" * 32 + ".json", _sample_verdict),
}


# -- the direct reader cases -----------------------------------------------------------------------------------


def _call(fn: Callable[[], Any], timeout: float = W.CASE_TIMEOUT) -> Any:
    """``fn()`` in a thread: its value or exception; ``TimeoutError`` when it does not return in time."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - judged by the caller
            got.append(("err", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if not got:
        return ("err", TimeoutError(f"no answer within {timeout:.0f} s"))
    return got[0]


def _unblock(path: Path) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _judge_read(case: str, kind: Any, got: Any, seconds: float, must_refuse: bool) -> W.Outcome:
    from rkpart.errors import MAX_MESSAGE

    status, value = got
    breaks = []
    msg = ""
    if status == "err":
        msg = str(value)
        if isinstance(value, TimeoutError):
            breaks.append("hang")
        elif not isinstance(value, kind.error) or type(value).exit_code != kind.error.exit_code:
            breaks.append(f"raised {type(value).__name__} ({str(value)[:160]}), not the kind's "
                          f"{kind.error.__name__}")
        elif "\n" in msg.strip():
            breaks.append("an error of more than one line")
        elif len(" ".join(msg.split())) > 20 * MAX_MESSAGE:
            breaks.append(f"an error of {len(msg)} characters")
    elif must_refuse:
        breaks.append("accepted")
    return W.Outcome(case, None if status == "ok" else kind.error.exit_code, msg[:200], seconds, tuple(breaks))


@dataclass(frozen=True)
class Sample:
    """A valid file of a kind: where it lies in the world (``rel``) or how to make one (``make``)."""

    kind: str
    rel: str  # relative to the world ("" for a made one)
    make: Callable[[Path], None] | None = None
    name: str = ""


def samples(world: Path, routes: list[W.Route]) -> dict[str, Sample]:
    """One valid file per registered kind: traced in the world, else from :data:`SAMPLES`."""
    out: dict[str, Sample] = {}
    for r in routes:
        for kind, rels in r.reads.items():
            out.setdefault(kind, Sample(kind, os.path.normpath(rels[0])))
    for kind, (name, make) in SAMPLES.items():
        out.setdefault(kind, Sample(kind, "", make, name))
    return out


def _place(world: Path, s: Sample, scratch: Path) -> tuple[Path, Path]:
    """A fresh copy of the sample under ``scratch/root`` -> (its path, its root folder)."""
    root = scratch / "root"
    root.mkdir()
    if s.make is not None:
        p = root / s.name
        s.make(p)
        return p, root
    src = world / s.rel
    top = Path(s.rel).parts[0]
    if (world / top).is_dir():  # the file's own folder: a plan, a calibration, the cache
        shutil.copytree(world / top, root / top, symlinks=True)
        return root / s.rel, root / top
    shutil.copy(src, root / src.name)
    return root / src.name, root


def reader_cases(world: Path, routes: list[W.Route], *, numbers: int | None = 8) -> Iterator[Case]:
    """Every kind x every variant, read directly (see the module doc); ``numbers``: at most that many
    numbers of a document get the NaN / Inf / 0 / -1 / 1e308 treatment (``None``: all of them)."""
    from rkpart.readers import KINDS

    found = samples(world, routes)
    for name in sorted(KINDS):
        kind = KINDS[name]
        s = found.get(name)
        if s is None:
            continue  # test_every_kind_has_a_sample names it
        for mname, mutate, must in W.mutations(kind.fmt):
            yield f"read {name} {mname}", _reader_case(world, kind, s, mname, mutate, must)
        if kind.fmt in ("json", "jsonl", "text"):
            with _scratch() as tmp:
                p, _root = _place(world, s, tmp)
                variants = W.number_mutations(p, kind.fmt, numbers) if kind.fmt != "text" else []
                paths = W.path_mutations(p, kind.fmt, numbers)
            for vname, write in variants:
                yield f"read {name} {vname}", _number_case(world, kind, s, vname, write)
            for vname, mutate in paths:
                yield f"read {name} {vname}", _reader_case(world, kind, s, vname, mutate, False)


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="rkpart-hostile-"))
    try:
        yield d
    finally:
        _rmtree(d)


def _rmtree(d: Path) -> None:
    for dirpath, _dirs, files in os.walk(d):
        for f in files:
            _unblock(Path(dirpath) / f)
    shutil.rmtree(d, ignore_errors=True)


def _read(kind: Any, p: Path, root: Path) -> Any:
    return kind.load(p, root=root)


def _reader_case(world: Path, kind: Any, s: Sample, mname: str, mutate: W.Mutate, must: bool
                 ) -> Callable[[Path], W.Outcome]:
    def run(scratch: Path) -> W.Outcome:
        p, root = _place(world, s, scratch)
        outside = scratch / "outside"
        outside.mkdir()
        mutate(p, outside)
        must_refuse = must or (mname == "symlink-in" and not kind.symlinks)
        t0 = time.monotonic()
        got = _call(lambda: _read(kind, p, root))
        _unblock(p)
        return _judge_read(f"read {kind.name} {mname}", kind, got, time.monotonic() - t0, must_refuse)

    return run


def _number_case(world: Path, kind: Any, s: Sample, vname: str, write: Callable[[Path], None]
                 ) -> Callable[[Path], W.Outcome]:
    def run(scratch: Path) -> W.Outcome:
        p, root = _place(world, s, scratch)
        write(p)
        t0 = time.monotonic()
        got = _call(lambda: _read(kind, p, root))
        return _judge_read(f"read {kind.name} {vname}", kind, got, time.monotonic() - t0, False)

    return run


# -- the CLI reader cases -------------------------------------------------------------------------------------


def _copy_world(world: Path, scratch: Path) -> Path:
    w = scratch / "world"
    shutil.copytree(world, w, symlinks=True)
    return w


def cli_cases(world: Path, routes: list[W.Route], *, numbers: int | None = 2,
              kinds: set[str] | None = None) -> Iterator[Case]:
    """Every route x every kind it read (its first file of the kind) x every variant (see the module doc)."""
    from rkpart.readers import KINDS

    for r in routes:
        for kname, rels in sorted(r.reads.items()):
            if kinds is not None and kname not in kinds:
                continue
            kind = KINDS[kname]
            rel = os.path.normpath(rels[0])
            # a file the command line names must be refused when hostile; one found beside it (a plan next
            # to a profile, the learned store, an old calibration's samples) may also be skipped as unusable;
            # a symlink the user named is theirs to give
            named = any(a.replace("{w}/", "") in (rel, str(Path(rel).parent)) for a in r.argv)
            top = "/" not in rel
            for mname, mutate, must in W.mutations(kind.fmt):
                refuse = must and named and not (top and mname == "symlink-out")
                yield (f"{r.name} <- {kname} {mname}",
                       _cli_case(world, r, rel, lambda p, o, m=mutate: m(p, o), refuse, mname))
            if kind.fmt in ("json", "jsonl") and numbers:
                for vname, write in W.number_mutations(world / rel, kind.fmt, numbers):
                    yield (f"{r.name} <- {kname} {vname}",
                           _cli_case(world, r, rel, lambda p, o, w=write: w(p), False, vname))
            if kind.fmt in ("json", "jsonl", "text") and numbers:
                # the files a document names, pointed out of its folder at a FIFO or /dev/zero: never a hang
                for vname, mutate in W.path_mutations(world / rel, kind.fmt, numbers):
                    yield (f"{r.name} <- {kname} {vname}",
                           _cli_case(world, r, rel, mutate, False, vname, planted=True))


def _cli_case(world: Path, route: W.Route, rel: str, mutate: Callable[[Path, Path], Any], must: bool,
              label: str = "", planted: bool = False) -> Callable[[Path], W.Outcome]:
    """``planted``: ``mutate`` pointed a name in the file out of the world (:func:`W.path_mutations`):
    opening anything outside the world is a break."""
    def run(scratch: Path) -> W.Outcome:
        w = _copy_world(world, scratch)
        outside = scratch / "outside"
        outside.mkdir()
        mutate(w / rel, outside)
        skip = (*route.outputs, rel, "cache", *(f"twin-{Path(rel).name}",), "calib-legacy")
        before = W.snapshot(w, skip)
        out_before = W.snapshot(outside)
        t0 = time.monotonic()
        with W.cache_env(w), W.opened() as seen:
            try:
                res: Any = W.invoke(route.args(w))
            except TimeoutError as e:
                res = e
        _unblock(w / rel)
        o = W.judge(f"{route.name} <- {rel} {label}", res, time.monotonic() - t0,
                    allowed=W.EXIT_CODES, must_refuse=must)
        breaks = list(o.breaks)
        out_real = os.path.realpath(outside)
        escaped = sorted({q for q in seen if planted and (os.path.realpath(q) + "/").startswith(out_real + "/")})
        if escaped:
            breaks.append(f"opened {escaped[0]}, outside the folder that names it")
        after = W.snapshot(w, skip)
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            breaks.append(f"the world changed outside the command's outputs: {changed[:3]}")
        if W.snapshot(outside) != out_before:
            breaks.append("a file outside the world was written")
        return W.Outcome(o.case, o.exit_code, o.message, o.seconds, tuple(breaks))

    return run


# -- the output cases -----------------------------------------------------------------------------------------


def output_params() -> list[tuple[str, click.Parameter]]:
    """Every output flag of every rkpart command: ``(command path, parameter)`` whose type is
    :class:`rkpart.cli_args.OutputFile` or :class:`~rkpart.cli_args.OutputFolder`."""
    from rkpart.cli import main
    from rkpart.cli_args import OutputFile, OutputFolder

    out = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in sorted(group.commands):
            cmd = group.commands[name]
            if isinstance(cmd, click.Group):
                walk(cmd, (*path, name))
                continue
            for p in cmd.params:
                if isinstance(p.type, (OutputFile, OutputFolder)):
                    out.append((" ".join((*path, name)), p))

    walk(main, ())
    return out


#: per command with an output: the rest of a command line that runs it on the world ("{dest}": the
#: destination, "{force}": --force or nothing), and its exit code when the destination is accepted
BASES: dict[str, tuple[list[str], int]] = {
    "fit": (["fit", "{w}/p.jsonl", "-o", "{dest}", "{force}"], 0),
    "profile": (["profile", "{w}/plan", "--rounds", "1", "--warmup", "0", "--threads", "1", "--no-snapshots",
                 "--interval", "0", "-q", "-o", "{dest}", "{force}"], 0),
    "drift": (["drift", "{w}/plan", "--toolkit", "9.9.9", "-q", "--accuracy", "{dest}", "{force}"], 7),
    "report": (["report", "{w}/plan", "{w}/p.jsonl", "-q", "-o", "{dest}", "{force}"], 0),
    "run": (["run", "{w}/plan", "-q", "--save-outputs", "{dest}", "{force}"], 0),
    "example": (["example", "{dest}", "{force}"], 0),
    "partition": (["partition", "{w}/model.onnx", "-s", "split", "-q", "-o", "{dest}", "{force}"], 0),
    "bundle": (["bundle", "{w}/hplan", "-q", "-o", "{dest}", "{force}"], 0),
    "calibrate": (["calibrate", "{w}/plan", "--samples", "1", "--steps", "1", "-q", "-o", "{dest}", "{force}"], 0),
    "tune": (["tune", "{w}/model.onnx", "-q", "-o", "{dest}"], 0),
    "repro": (["repro", "{w}/model.onnx", "-q", "-o", "{dest}", "{force}"], 0),
    # the world holds no diffusers pipeline folder: its refusals only (they come before torch is imported)
    "export": (["export", "{w}/hplan", "-q", "-o", "{dest}", "{force}"], 3),
    # no pipeline folder nor torch needed: its refusals come before the encoders are loaded
    "encode": (["encode", "{w}/hplan", "--pipeline", "{w}/plan/plan.json", "--prompt", "a cat", "-q", "-o", "{dest}",
                "{force}"], 3),
}
#: the name of a new destination per command (a report page must end in .html)
DEST_NAME = {"report": "r.html", "example": "m.onnx", "run": "o.npz", "profile": "p2.jsonl", "fit": "m2.json",
             "drift": "acc2.json", "encode": "e.npz"}
#: what the destination is, and the exit codes that may answer it (issue 51's output rule)
DESTINATIONS: dict[str, frozenset[int]] = {
    "new": frozenset(),  # the base's own code
    "input": frozenset({2, 6}),  # 2: a path of the wrong kind for the option (a plan.json as a report page)
    "in-plan": frozenset({6}),
    "in-bundle": frozenset({6}),
    "in-calibration": frozenset({6}),
    "in-cache": frozenset({6}),
    "foreign": frozenset({6}),
    "foreign-force": frozenset({6}),
    "own": frozenset({6}),
    "own-force": frozenset(),
    "symlink-out": frozenset({6}),
    "symlink-dangling": frozenset({6}),
    "fifo": frozenset({2, 6}),
    "device": frozenset({2, 6}),
    "socket": frozenset({2, 6}),
    "folder": frozenset({2, 6}),
}
#: commands whose first run cannot make their own file here (drift needs a toolkit): a file rkpart wrote, from
#: the world, stands for it
OWN_FROM = {"drift": "acc.json"}
#: destinations a command takes (``example DEST`` writes into a folder DEST)
ACCEPTED = {("example", "folder")}
#: cases that run the whole command: only for the quick ones in the test suite
_SLOW_COMMANDS = {"tune", "repro", "calibrate", "partition", "bundle", "report", "profile"}


def output_cases(world: Path, *, full: bool = True) -> Iterator[Case]:
    """Every output flag x every destination of :data:`DESTINATIONS` (``full=False``: the
    destinations that run a whole command only for the quick commands)."""
    for cmd, param in output_params():
        if cmd not in BASES:
            continue  # test_every_output_flag_has_a_base names it
        folder_out = type(param.type).__name__ == "OutputFolder"
        for dest in DESTINATIONS:
            runs_whole = dest in ("new", "own-force", "own")
            if runs_whole and not full and cmd in _SLOW_COMMANDS:
                continue
            if folder_out and dest in ("own", "own-force", "symlink-dangling", "fifo", "device", "socket", "folder"):
                continue  # the folder rules have their own suites (test_writes_hostile); kept to what holds for both
            if cmd in ("tune", "repro", "export", "encode") and runs_whole:
                continue  # minutes each (a tune, a toolkit build matrix, an export, text encoders): refusals only
            yield f"{cmd} {param.opts[0]} {dest}", _output_case(world, cmd, dest, folder_out)


def _output_case(world: Path, cmd: str, dest_kind: str, folder_out: bool) -> Callable[[Path], W.Outcome]:
    argv, ok = BASES[cmd]

    def run(scratch: Path) -> W.Outcome:
        w = _copy_world(world, scratch)
        outside = scratch / "outside"
        outside.mkdir()
        name = DEST_NAME.get(cmd, "dest")
        dest = scratch / "new" / name
        dest.parent.mkdir()
        force = dest_kind.endswith("-force")
        victim: Path | None = None
        if dest_kind == "input":
            dest = {"fit": w / "p.jsonl", "example": w / "model.onnx", "partition": w / "model.onnx",
                    "bundle": w / "hplan", "calibrate": w / "plan", "tune": w / "model.onnx",
                    "repro": w / "model.onnx", "export": w / "hplan"}.get(cmd, w / "plan" / "plan.json")
        elif dest_kind.startswith("in-"):
            where = {"in-plan": "plan", "in-bundle": "bundle", "in-calibration": "calib", "in-cache": "cache"}
            dest = w / where[dest_kind] / name
        elif dest_kind.startswith("foreign"):
            victim = dest
            (dest.mkdir() if folder_out else None)
            (dest / "notes.txt" if folder_out else dest).write_text("the user's own\n")
        elif dest_kind.startswith("own") and cmd in OWN_FROM:
            shutil.copy(w / OWN_FROM[cmd], dest)
        elif dest_kind.startswith("own"):
            with W.cache_env(w):
                first = W.invoke([a for a in _args(argv, w, dest, False) if a])
            if first.exit_code != 0:
                return W.Outcome(f"{cmd} {dest_kind}", first.exit_code, first.output[-200:], 0.0,
                                 ("the first run, which makes rkpart's own file, failed",))
        elif dest_kind == "symlink-out":
            victim = outside / "target"
            victim.write_text("the user's own\n")
            dest.symlink_to(victim)
        elif dest_kind == "symlink-dangling":
            dest.symlink_to(outside / "nothing-here")
        elif dest_kind == "fifo":
            os.mkfifo(dest)
        elif dest_kind == "device":
            os.mknod(dest, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        elif dest_kind == "socket":
            W.make_socket(dest)
        elif dest_kind == "folder" and not folder_out:
            dest.mkdir()
            (dest / "keep.txt").write_text("mine\n")
        skip = ("cache",) if dest_kind != "in-cache" else ()
        before = W.snapshot(w, skip)
        out_before = W.snapshot(outside)
        around = W.snapshot(dest.parent) if dest.parent != w else {}
        t0 = time.monotonic()
        with W.cache_env(w):
            try:
                res: Any = W.invoke([a for a in _args(argv, w, dest, force) if a])
            except TimeoutError as e:
                res = e
        _unblock(dest)
        allowed = DESTINATIONS[dest_kind] or frozenset({ok})
        if (cmd, dest_kind) in ACCEPTED:
            allowed = frozenset({ok})
        elif folder_out and allowed != {ok}:
            allowed |= {2}  # click's own check of a folder option (a file there: "is a file"), one line and exit 2
        o = W.judge(f"{cmd} -> {dest_kind}", res, time.monotonic() - t0, allowed=allowed | ({0} if ok == 7 and
                    dest_kind in ("new", "own-force") else frozenset()))
        breaks = list(o.breaks)
        refused = o.exit_code not in (0, ok) or (ok == 7 and o.exit_code == 7 and dest_kind not in ("new", "own-force"))
        if W.snapshot(w, skip) != before and not dest_kind.startswith("in-") and dest_kind != "input":
            breaks.append("the world changed")
        if dest_kind in ("input",) or dest_kind.startswith("in-"):
            after = W.snapshot(w, skip)
            if after != before:
                breaks.append(f"wrote into {dest_kind}: {sorted(set(after) ^ set(before))[:3]}")
        if W.snapshot(outside) != out_before:
            breaks.append("a file outside the destination was written (through a symlink?)")
        if refused and dest.parent != w and dest_kind != "input" and not dest_kind.startswith("in-") \
                and W.snapshot(dest.parent) != around:
            breaks.append("a refused destination's folder changed (a temp file left, or the file replaced)")
        if victim is not None and victim.exists() and not victim.is_symlink():
            text = (victim / "notes.txt" if victim.is_dir() else victim).read_text()
            if text != "the user's own\n":
                breaks.append("the user's file was replaced")
        return W.Outcome(o.case, o.exit_code, o.message, o.seconds, tuple(breaks))

    return run


#: the runner's output flags: the rest of its command line on the world's host-only bundle
RUNNER_BASES: dict[str, list[str]] = {
    "--save-outputs": ["--bundle", "{w}/bundle", "--inputs", "{w}/in.npz", "--save-outputs", "{dest}", "{force}"],
    "--latent-out": ["--bundle", "{w}/bundle", "--steps", "1", "--cond", "{w}/in.npz", "--latent-out", "{dest}",
                     "{force}"],
    # the world's bundle has no VAE decoder: an accepted --image-out is answered by that refusal
    # (NO_VAE), which comes after the output rule; the latent is never written
    "--image-out": ["--bundle", "{w}/bundle", "--steps", "1", "--cond", "{w}/in.npz", "--latent-out",
                    "{w}/image-run-latent.npy", "--image-out", "{dest}", "{force}"],
}
#: how the runner answers a run on a bundle without a VAE decoder once --image-out is accepted
NO_VAE = "needs the VAE decoder"
#: a new destination per runner flag
RUNNER_DEST = {"--save-outputs": "o.npz", "--latent-out": "latent.npy", "--image-out": "image.png"}
RUNNER_DESTINATIONS = ("new", "input", "in-bundle", "foreign", "foreign-force", "own", "own-force", "symlink-out",
                       "symlink-dangling", "fifo", "device", "socket", "folder")


def runner_output_cases(world: Path) -> Iterator[Case]:
    """Every output flag of the bundle runner (its ``OUTPUT_FLAGS``) x every destination."""
    runner = _runner(world)
    for flag in runner.OUTPUT_FLAGS:
        for dest in RUNNER_DESTINATIONS:
            yield f"runner {flag} {dest}", _runner_case(world, flag, dest)


def _runner(world: Path) -> Any:
    from tests.bundle.test_bundle import load_runner

    return load_runner(world / "bundle")


def _run_runner(runner: Any, argv: list[str]) -> tuple[int, str]:
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = runner.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return int(code), err.getvalue()


def _runner_case(world: Path, flag: str, dest_kind: str) -> Callable[[Path], W.Outcome]:
    from rkpart.errors import MAX_MESSAGE

    def run(scratch: Path) -> W.Outcome:
        w = _copy_world(world, scratch)
        runner = _runner(w)
        outside = scratch / "outside"
        outside.mkdir()
        dest = scratch / "new" / RUNNER_DEST[flag]
        dest.parent.mkdir()
        victim: Path | None = None
        if dest_kind == "input":
            dest = w / "in.npz"
        elif dest_kind == "in-bundle":
            dest = w / "bundle" / "manifest.json"
        elif dest_kind.startswith("foreign"):
            victim = dest
            dest.write_text("the user's own\n")
        elif dest_kind.startswith("own") and flag == "--image-out":  # a PNG the runner writes stands for its own
            dest.write_bytes(runner.png_bytes(np.zeros((2, 2, 3), np.uint8)))
        elif dest_kind.startswith("own"):
            code, err = _run_runner(runner, [a for a in _args(RUNNER_BASES[flag], w, dest, False) if a])
            if code != 0:
                return W.Outcome(f"runner {flag} {dest_kind}", code, err[-200:], 0.0, ("the first run failed",))
        elif dest_kind == "symlink-out":
            victim = outside / "target"
            victim.write_text("the user's own\n")
            dest.symlink_to(victim)
        elif dest_kind == "symlink-dangling":
            dest.symlink_to(outside / "nothing-here")
        elif dest_kind == "fifo":
            os.mkfifo(dest)
        elif dest_kind == "device":
            os.mknod(dest, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        elif dest_kind == "socket":
            W.make_socket(dest)
        elif dest_kind == "folder":
            dest.mkdir()
        before = W.snapshot(w)
        out_before = W.snapshot(outside)
        around = W.snapshot(dest.parent) if dest.parent != w else {}
        t0 = time.monotonic()
        argv = [a for a in _args(RUNNER_BASES[flag], w, dest, dest_kind.endswith("-force")) if a]
        got = _call(lambda: _run_runner(runner, argv))
        _unblock(dest)
        seconds = time.monotonic() - t0
        breaks = []
        if got[0] == "err":
            return W.Outcome(f"runner {flag} {dest_kind}", None, str(got[1])[:200], seconds,
                             (f"{type(got[1]).__name__}: {str(got[1])[:200]}",))
        code, err = got[1]
        accepted = dest_kind in ("new", "own-force")
        want = {0} if accepted and flag != "--image-out" else {2}
        if code not in want:
            breaks.append(f"exit {code}, wanted {sorted(want)}")
        lines = [ln for ln in err.splitlines() if ln.startswith("runner: error")]
        if flag == "--image-out" and (NO_VAE in err) != accepted:
            breaks.append("the destination was accepted" if not accepted else f"refused: {err.strip()[:120]}")
        if code == 2 and (len(lines) != 1 or len(lines[0]) > MAX_MESSAGE + 20):
            breaks.append(f"{len(lines)} error lines")
        if "Traceback" in err:
            breaks.append("a traceback")
        if W.snapshot(w) != before:
            breaks.append("the world (its bundle, its inputs) changed")
        if W.snapshot(outside) != out_before:
            breaks.append("a file outside the destination was written")
        if code != 0 and dest.parent != w and dest.parent != w / "bundle" and W.snapshot(dest.parent) != around:
            breaks.append("a refused destination's folder changed")
        if victim is not None and victim.read_text() != "the user's own\n":
            breaks.append("the user's file was replaced")
        return W.Outcome(f"runner {flag} {dest_kind}", code, lines[0] if lines else "", seconds, tuple(breaks))

    return run


def _args(argv: list[str], w: Path, dest: Path, force: bool) -> list[str]:
    return [a.replace("{w}", str(w)).replace("{dest}", str(dest)).replace("{force}", "--force" if force else "")
            for a in argv]


# -- running cases --------------------------------------------------------------------------------------------


def run_case(case: Case) -> W.Outcome:
    """One case in a scratch folder of its own (removed after, FIFOs unblocked first)."""
    with _scratch() as tmp:
        return case[1](tmp)
