"""rkpart.readers, the one way in (issue 51), and rkpart.output's rule for a command's ``-o FILE``:
each refusal on real files (a FIFO, a device node, symlinks, ``../``, a sparse multi-TiB file, deep
JSON), in milliseconds.  The generated suites (tests/hostile/test_generated_hostile.py) run every
registered kind and every output flag through the same rules."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import click
import numpy as np
import pytest

from rkpart.errors import OutputExistsError, SpecError, UserError, one_line
from rkpart.output import claim_output_file, json_format_is, managing_folder, write_marker
from rkpart.readers import FileKind, tracing

KIND = FileKind("test document", "json", 1 << 16, SpecError, register=False)
INSIDE = FileKind("test record", "json", 1 << 16, SpecError, symlinks=False, register=False)


def _load(kind: FileKind, p: Path, root: Path | None = None) -> object:
    got: list[object] = []

    def run() -> None:
        try:
            got.append(kind.load(p, root=root))
        except UserError as e:
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert got, f"blocked reading {p}"
    return got[0]


def _refused(kind: FileKind, p: Path, *needles: str, root: Path | None = None) -> str:
    got = _load(kind, p, root)
    assert isinstance(got, kind.error), got
    msg = str(got)
    assert "\n" not in msg and msg.startswith(f"{kind.name} {p}")
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_a_fifo_a_device_and_dev_zero_are_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    _refused(KIND, tmp_path / "fifo.json", "is a FIFO, not a regular file")
    os.mknod(tmp_path / "zero.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    _refused(KIND, tmp_path / "zero.json", "is a character device")
    (tmp_path / "link.json").symlink_to("/dev/zero")
    _refused(KIND, tmp_path / "link.json", "character device")
    _refused(INSIDE, tmp_path / "link.json", "is a symlink")


def test_size_is_judged_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(3 << 40)  # sparse: never read
    _refused(KIND, p, "too large", str(3 << 40))


def test_a_path_leaving_its_folder_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "plan"
    root.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (root / "ok.json").write_text("{}")
    assert _load(KIND, root / "ok.json", root) == {}
    _refused(KIND, root / ".." / "secret.json", "leaves its folder", root=root)
    (root / "out.json").symlink_to(tmp_path / "secret.json")
    _refused(KIND, root / "out.json", "symlink leaving its folder", root=root)
    (root / "in.json").symlink_to("ok.json")
    assert _load(KIND, root / "in.json", root) == {}  # a symlink staying inside: followed
    _refused(INSIDE, root / "in.json", "is a symlink", root=root)  # unless the kind reads only its own files
    for rel in ("../secret.json", "/etc/passwd", "a/../../secret.json", ""):
        with pytest.raises(SpecError, match="leaves its folder"):
            KIND.within(root, rel)
    assert KIND.within(root, "stages/../ok.json") == root / "stages/../ok.json"


def test_bytes_that_are_not_the_format_are_one_line(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    for data, needle in ((b"[" * 20_000 + b"]" * 20_000, "nested"), (b'{"a": ' + b"9" * 5000 + b"}", "digits"),
                         (b"\xff\xfe{", "UTF-8"), (b"{", "not valid JSON")):
        p.write_bytes(data)
        _refused(KIND, p, needle)


def test_a_check_refuses_in_the_kinds_error(tmp_path: Path) -> None:
    def check(doc: object, where: str) -> None:
        if not isinstance(doc, dict) or doc.get("n", 0) <= 0:
            raise SpecError(f"{where}: n must be > 0")

    kind = FileKind("checked", "json", 1 << 10, SpecError, check=check, register=False)
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"n": 0}))
    with pytest.raises(SpecError, match="n must be > 0"):
        kind.load(p)
    p.write_text(json.dumps({"n": 3}))
    assert kind.load(p) == {"n": 3}


def test_npy_headers_are_checked_before_anything_is_allocated(tmp_path: Path) -> None:
    import io

    kind = FileKind("sample", "npy", 1 << 20, UserError, register=False)
    p = tmp_path / "s.npy"
    np.save(p, np.arange(4, dtype=np.float32))
    assert list(kind.load(p)) == [0, 1, 2, 3]
    hdr = io.BytesIO()
    np.lib.format.write_array_header_2_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    p.write_bytes(hdr.getvalue() + b"\0" * 16)
    _refused(kind, p, "claims shape")
    np.save(p, np.array([{}], dtype=object), allow_pickle=True)
    _refused(kind, p, "not a numeric one")


def test_tracing_records_what_was_read(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text("{}")
    with tracing() as seen:
        KIND.load(p)
    assert seen == [("test document", p.absolute())]


def test_one_line_bounds_every_message() -> None:
    long = "run ids: " + ", ".join(f"{i:016x}" for i in range(20_000))
    short = one_line(long + "\nsecond line")
    assert "\n" not in short and len(short) <= 480 and short.startswith("run ids: ") and "characters ..." in short
    assert one_line("a\n  b") == "a b"


# -- the output rule -----------------------------------------------------------------------------------


def test_an_output_is_never_an_input_nor_inside_a_folder_rkpart_manages(tmp_path: Path) -> None:
    owned = json_format_is("rkpart-cost-model")
    src = tmp_path / "p.jsonl"
    src.write_text("{}\n")
    with pytest.raises(OutputExistsError, match="is one of its inputs"):
        claim_output_file(src, what="cost model", force=True, owned=owned, inputs=[src])
    plan = tmp_path / "plan"
    (plan / "stages").mkdir(parents=True)
    (plan / "plan.json").write_text("{}")
    with pytest.raises(OutputExistsError, match="an rkpart plan folder"):
        claim_output_file(plan / "new.json", what="cost model", force=True, owned=owned)
    with pytest.raises(OutputExistsError, match="one of its inputs"):
        claim_output_file(plan / "plan.json", what="profile output", force=True, owned=owned, inputs=[plan])
    assert managing_folder(plan / "rknn" / "objects" / "x") == (plan, "plan folder")
    bundle = tmp_path / "board"
    bundle.mkdir()
    write_marker(bundle, "bundle")
    assert managing_folder(bundle / "latent.npy") == (bundle, "bundle folder")
    assert managing_folder(tmp_path / "free.json") is None


def test_force_replaces_only_a_file_rkpart_wrote(tmp_path: Path) -> None:
    owned = json_format_is("rkpart-cost-model")
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"note": "mine"}))
    with pytest.raises(OutputExistsError, match="exists; use --force"):
        claim_output_file(p, what="cost model", force=False, owned=owned)
    with pytest.raises(OutputExistsError, match="rkpart did not write it"):
        claim_output_file(p, what="cost model", force=True, owned=owned)
    p.write_text(json.dumps({"format": "rkpart-cost-model", "version": 1}))
    assert claim_output_file(p, what="cost model", force=True, owned=owned) == p
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(OutputExistsError, match="FIFO"):
        claim_output_file(tmp_path / "fifo.json", what="cost model", force=True, owned=owned)


def _commands() -> list[tuple[str, click.Command]]:
    from rkpart.cli import main

    out: list[tuple[str, click.Command]] = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in sorted(group.commands):
            cmd = group.commands[name]
            if isinstance(cmd, click.Group):
                walk(cmd, (*path, name))
            else:
                out.append((" ".join((*path, name)), cmd))

    walk(main, ())
    return out


def test_no_output_of_any_command_is_one_of_its_path_inputs(tmp_path: Path) -> None:
    """Derived from the click commands: for every output parameter (OutputFile / OutputFolder) and every
    other path parameter of the same command, the output given as that input itself, a symlink to it or
    (a file) a hard link of it is refused in one line before the command runs; a folder output holding
    the input too.  (The commands' own lists missed --embeds, --pipeline, --toolkits-dir...)"""
    from rkpart.cli_args import OutputFile, OutputFolder, outputs_are_not_inputs

    src_file, src_dir = tmp_path / "in.npz", tmp_path / "in-dir"
    src_file.write_bytes(b"x")
    src_dir.mkdir()
    (tmp_path / "sym-file").symlink_to(src_file)
    (tmp_path / "sym-dir").symlink_to(src_dir)
    os.link(src_file, tmp_path / "hard-file")
    pairs = 0
    for name, cmd in _commands():
        outs = [p for p in cmd.params if isinstance(p.type, (OutputFile, OutputFolder))]
        ins = [p for p in cmd.params if isinstance(p.type, click.Path) and p not in outs]
        for out in outs:
            for inp in ins:
                takes_file = getattr(inp.type, "file_okay", True)
                given = src_file if takes_file else src_dir
                dests = ([given, tmp_path / "sym-file", tmp_path / "hard-file"] if takes_file
                         else [given, tmp_path / "sym-dir", src_dir / "sub"])
                if isinstance(out.type, OutputFolder) and takes_file:
                    dests.append(tmp_path)  # a folder holding the input
                for dest in dests:
                    ctx = click.Context(cmd, info_name=name)
                    ctx.params = {inp.name: (given,) if inp.multiple or inp.nargs != 1 else given,
                                  out.name: dest}
                    with pytest.raises(OutputExistsError, match="one of its inputs") as e:
                        outputs_are_not_inputs(ctx)
                    assert "\n" not in str(e.value)
                    pairs += 1
                ctx = click.Context(cmd, info_name=name)
                ctx.params = {inp.name: (given,) if inp.multiple or inp.nargs != 1 else given,
                              out.name: tmp_path / "elsewhere" / "new"}
                outputs_are_not_inputs(ctx)  # anything else is the command's to judge
    assert pairs >= 60, pairs
