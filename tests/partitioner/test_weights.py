"""How a plan holds weights (issue 15): per-stage copies hashed once, and ``--weights link``.

A model with external data (the Anima architecture at a small size, seeded random fp32
weights) is partitioned in both modes; link-mode stages must load standalone with
``onnx.load`` and give ONNX Runtime the same outputs as the copied stages, stay inside the
plan folder, and the plan must be byte-identical across runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rkpart.errors import InvalidModelError
from rkpart.pipeline import PartitionConfig, partition
from rkpart.plan.extract import stage_sha256
from rkpart.plan.plan import load_plan
from rkpart.plan.weights import LINK_DIR, link_one
from tests.models.anima import AnimaConfig, build_anima_onnx

#: every weight over 64 bytes to a stage data file
SMALL_STAGE_DATA = PartitionConfig(external_threshold=64)


@pytest.fixture(scope="module")
def ext_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = AnimaConfig.tiny(num_blocks=2, dtype="float32")
    return build_anima_onnx(cfg, tmp_path_factory.mktemp("ext") / "anima.onnx", external_data=True)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_copy_mode_sha256_hashed_while_copying_equals_the_files(tmp_path: Path, ext_model: Path) -> None:
    plan = partition(ext_model, tmp_path / "p", "split")
    for s in plan.stages:
        assert stage_sha256(tmp_path / "p" / s.file) == s.sha256, s.id
    assert "weights" not in plan.extra  # the default plan is unchanged by the option


def test_link_mode_stages_reference_one_linked_file(tmp_path: Path, ext_model: Path) -> None:
    data = ext_model.with_name(ext_model.name + ".data")
    plan_l = partition(ext_model, tmp_path / "link", "split", weights="link")
    plan_c = partition(ext_model, tmp_path / "copy", "split")
    fl, fc = tmp_path / "link", tmp_path / "copy"
    linked = fl / "stages" / LINK_DIR / data.name
    assert linked.read_bytes() == data.read_bytes()
    assert os.stat(data).st_nlink == 1 and os.stat(linked).st_nlink == 1  # no hard links: onnx refuses them
    assert plan_l.extra["weights"]["files"][f"{LINK_DIR}/{data.name}"]["size"] == data.stat().st_size
    # the per-stage data files hold only what the source did not store externally
    own_l = sum(p.stat().st_size for p in (fl / "stages").glob("*.onnx.data"))
    own_c = sum(p.stat().st_size for p in (fc / "stages").glob("*.onnx.data"))
    assert own_l < own_c - data.stat().st_size // 2
    load_plan(fl)  # every stage file inside the plan folder
    rng = np.random.default_rng(0)
    for sl, sc in zip(plan_l.npu_stages, plan_c.npu_stages, strict=True):
        m = onnx.load(str(fl / sl.file))  # standalone: resolves weights/<file> next to the stage
        refs = [e.value for i in m.graph.initializer for e in i.external_data if e.key == "location"]
        assert all(r in (f"{LINK_DIR}/{data.name}", Path(sl.file).name + ".data") for r in refs)
        feeds = {t: rng.standard_normal(plan_c.tensors[t].shape).astype(plan_c.tensors[t].dtype) for t in sc.inputs}
        got = ort.InferenceSession(str(fl / sl.file)).run(None, feeds)
        want = ort.InferenceSession(str(fc / sc.file)).run(None, feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_link_mode_is_byte_identical_across_runs(tmp_path: Path, ext_model: Path) -> None:
    partition(ext_model, tmp_path / "a", "split", weights="link")
    partition(ext_model, tmp_path / "b", "split", weights="link")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_link_mode_replaces_a_copy_plan_and_back(tmp_path: Path, ext_model: Path) -> None:
    out = tmp_path / "p"
    partition(ext_model, out, "split")
    partition(ext_model, out, "split", force=True, weights="link")
    assert (out / "stages" / LINK_DIR).is_dir()
    partition(ext_model, out, "split", force=True)
    assert not (out / "stages" / LINK_DIR).exists()
    fresh = tmp_path / "fresh"
    partition(ext_model, fresh, "split")
    assert _files(out) == _files(fresh)


REFLINK_DIR = os.environ.get("RKPART_TEST_REFLINK_DIR")


@pytest.mark.skipif(not REFLINK_DIR, reason="set RKPART_TEST_REFLINK_DIR to a folder on XFS/Btrfs to test reflinks")
def test_reflink_shares_blocks_and_is_copy_on_write(tmp_path: Path) -> None:
    assert REFLINK_DIR
    work = Path(REFLINK_DIR) / f"rkpart-test-{os.getpid()}"
    work.mkdir()
    try:
        src = work / "w.data"
        src.write_bytes(os.urandom(1 << 20))
        assert link_one(src, work / "plan" / "w.data") == "reflink"
        with open(src, "r+b") as f:  # rewriting the source in place leaves the plan's copy alone
            f.write(b"\0" * 16)
        assert (work / "plan" / "w.data").read_bytes()[:16] != b"\0" * 16
    finally:
        shutil.rmtree(work)


def test_without_reflink_the_file_is_copied_not_hard_linked(tmp_path: Path) -> None:
    src = tmp_path / "w.data"
    src.write_bytes(b"x" * 4096)
    how = link_one(src, tmp_path / "out" / "w.data")
    assert how in ("reflink", "copy")
    assert os.stat(src).st_nlink == 1
    assert (tmp_path / "out" / "w.data").read_bytes() == src.read_bytes()


def test_build_key_of_a_linked_stage_covers_its_slices_only(tmp_path: Path, ext_model: Path) -> None:
    from rkpart.compile.cache import build_key

    model = tmp_path / "m" / ext_model.name
    model.parent.mkdir()
    shutil.copy(ext_model, model)
    shutil.copy(ext_model.with_name(ext_model.name + ".data"), model.with_name(model.name + ".data"))
    plan = partition(model, tmp_path / "p", "split", weights="link")
    folder = tmp_path / "p"
    shared = folder / "stages" / LINK_DIR / (model.name + ".data")

    def slices(stage_file: str) -> list[tuple[int, int]]:
        m = onnx.load(str(folder / stage_file), load_external_data=False)
        out = []
        for t in m.graph.initializer:
            info = {e.key: e.value for e in t.external_data}
            if info.get("location", "").startswith(LINK_DIR):
                out.append((int(info["offset"]), int(info["length"])))
        return out

    a, b = [s for s in plan.npu_stages if slices(s.file)][:2]
    keys = {s.id: build_key(folder / s.file, "2.5.0", "rk3588", {}) for s in (a, b)}
    off, length = slices(b.file)[0]  # a byte b reads and a does not
    assert all(not (o <= off < o + n) for o, n in slices(a.file))
    with open(shared, "r+b") as f:
        f.seek(off + length // 2)
        byte = f.read(1)
        f.seek(off + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert build_key(folder / a.file, "2.5.0", "rk3588", {}) == keys[a.id]
    assert build_key(folder / b.file, "2.5.0", "rk3588", {}) != keys[b.id]


def test_link_mode_stages_pass_the_integrity_checks_and_an_outside_data_file_does_not(
        tmp_path: Path, ext_model: Path) -> None:
    from rkpart.errors import SpecError
    from rkpart.plan.verify import stage_onnx

    out = tmp_path / "link"
    plan = partition(ext_model, out, "split", weights="link")
    for s in plan.stages:  # what compile, run and profile open each stage through
        assert stage_onnx(out, s) == out / s.file
    # a stage pointing at a data file that is neither its own nor under stages/weights/ is refused
    s = plan.npu_stages[0]
    stray = out / "stages" / "stray.data"
    shutil.copyfile(out / "stages" / LINK_DIR / ext_model.with_name(ext_model.name + ".data").name, stray)
    m = onnx.load(str(out / s.file), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location" and e.value.startswith(f"{LINK_DIR}/"):
                e.value = "stray.data"
    onnx.save(m, str(out / s.file))
    with pytest.raises(SpecError, match="not the stage's own data file"):
        stage_onnx(out, s, verify=False)


class _Interrupt(KeyboardInterrupt):
    """Stands in for a kill after some stages were written (the staging folder stays)."""


def _interrupt_after(n: int) -> Callable[[str], None]:
    seen: list[str] = []

    def progress(msg: str) -> None:
        if msg.startswith("["):
            seen.append(msg)
            if len(seen) > n:
                raise _Interrupt
    return progress


def _own_copy(tmp_path: Path, ext_model: Path) -> Path:
    model = tmp_path / "m" / ext_model.name
    model.parent.mkdir()
    shutil.copy(ext_model, model)
    shutil.copy(ext_model.with_name(ext_model.name + ".data"), model.with_name(model.name + ".data"))
    return model


def test_copy_mode_hashes_each_weight_byte_once(tmp_path: Path, ext_model: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume key does not read the external data, and each source slice is read once:
    hashed and written from the same buffer (spies on the hashing and writing paths,
    delegating to the real ones)."""
    import rkpart.io
    import rkpart.plan.extract as extract

    data = ext_model.with_name(ext_model.name + ".data")
    whole: list[str] = []
    written: list[int] = []
    rehashed: list[int] = []
    real_hash_file, real_write, real_hash_pieces = rkpart.io.hash_file, extract.write_pieces, extract._hash_pieces

    def from_data(pieces: list[Any]) -> int:
        return sum(n for kind, src, _, n in pieces if kind == "file" and Path(src) == data)

    def hash_file(h: object, path: object, *a: object, **k: object) -> None:
        whole.append(Path(str(path)).name)
        real_hash_file(h, path, *a, **k)  # type: ignore[arg-type]

    def write_pieces(pieces: list[Any], path: Path, h: object = None) -> int:
        assert h is not None  # hashed while written
        written.append(from_data(pieces))
        return real_write(pieces, path, h)

    def hash_pieces(head: bytes, pieces: list[Any]) -> str:
        rehashed.append(from_data(pieces))
        return real_hash_pieces(head, pieces)

    monkeypatch.setattr(rkpart.io, "hash_file", hash_file)
    monkeypatch.setattr(extract, "write_pieces", write_pieces)
    monkeypatch.setattr(extract, "_hash_pieces", hash_pieces)
    plan = partition(ext_model, tmp_path / "p", "split", config=SMALL_STAGE_DATA)
    assert data.name not in whole
    assert sum(rehashed) == 0  # a fresh run re-reads nothing
    own = sum(p.stat().st_size for p in (tmp_path / "p" / "stages").glob("*.onnx.data"))
    assert 0 < sum(written) <= own  # each slice once (the stage data files add only padding and inline weights)
    assert len(written) == len([s for s in plan.stages if (tmp_path / "p" / (s.file + ".data")).exists()])


def test_resume_rechecks_each_stage_against_its_source_slices(tmp_path: Path, ext_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume key identifies the external data by size, inode and times, not content.  A file
    system whose timestamps do not move on a rewrite (coarse clocks, a rewrite in the same tick)
    cannot be produced on demand, so ``file_identity`` is replaced by a *fake* that never changes.
    Even then no stale weight is reused: a resumed stage must hash, from the source as it is now,
    to what it recorded."""
    import rkpart.plan.outdir as outdir

    monkeypatch.setattr(outdir, "file_identity", lambda p: [p.name])  # fake: identity never changes
    model = _own_copy(tmp_path, ext_model)
    out = tmp_path / "out"
    with pytest.raises(_Interrupt):
        partition(model, out, "split", config=SMALL_STAGE_DATA, progress=_interrupt_after(8))
    import json

    journal = (tmp_path / ".out.partial" / "stages" / "done.jsonl").read_text().splitlines()
    done = {Path(json.loads(line)["file"]).name: json.loads(line)["sha256"] for line in journal}
    data = model.with_name(model.name + ".data")
    raw = bytearray(data.read_bytes())
    raw[: len(raw) // 2] = bytes(len(raw) // 2)  # zero half the weights, same size
    data.write_bytes(bytes(raw))
    msgs: list[str] = []
    plan = partition(model, out, "split", config=SMALL_STAGE_DATA, progress=msgs.append)
    fresh = partition(model, tmp_path / "fresh", "split", config=SMALL_STAGE_DATA)
    assert [s.sha256 for s in plan.stages] == [s.sha256 for s in fresh.stages]
    assert _files(out) == _files(tmp_path / "fresh")
    # some finished stages held now-stale weights: they were written again, not resumed
    names = {Path(s.file).name: s.sha256 for s in plan.stages}
    stale = {n for n, sha in names.items() if n in done and done[n] != sha}
    assert stale
    assert len([m for m in msgs if "(resumed)" in m]) == len(done) - len(stale)


def test_resume_key_follows_the_data_files_identity(tmp_path: Path, ext_model: Path) -> None:
    """Touching the external data (same bytes, new times) or replacing it starts over; nothing
    changed resumes (each resumed stage re-checked by content)."""
    model = _own_copy(tmp_path, ext_model)
    data = model.with_name(model.name + ".data")
    out = tmp_path / "out"

    def resumed_after(change: Callable[[], object]) -> int:
        with pytest.raises(_Interrupt):
            partition(model, out, "split", force=True, config=SMALL_STAGE_DATA, progress=_interrupt_after(4))
        change()
        msgs: list[str] = []
        partition(model, out, "split", force=True, config=SMALL_STAGE_DATA, progress=msgs.append)
        return len([m for m in msgs if "(resumed)" in m])

    assert resumed_after(lambda: None) > 0
    assert resumed_after(lambda: os.utime(data)) == 0
    assert resumed_after(lambda: shutil.copyfile(ext_model.with_name(ext_model.name + ".data"), data)) == 0


def test_sync_tree_flushes_every_file_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one flush at the end covers every file and folder of the staging tree (a spy on
    ``os.fsync``, delegating to it)."""
    import rkpart.plan.weights as w

    (tmp_path / "t" / "stages" / LINK_DIR).mkdir(parents=True)
    for i in range(40):
        (tmp_path / "t" / "stages" / f"{i}.onnx").write_bytes(os.urandom(100))
    (tmp_path / "t" / "plan.json").write_text("{}")
    synced: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(w.os, "fsync", spy)
    w.sync_tree(tmp_path / "t")
    want = {p.stat().st_ino for p in [tmp_path / "t", *(tmp_path / "t").rglob("*")]}
    assert sorted(synced) == sorted(want)


@pytest.mark.skipif(tuple(int(x) for x in onnx.__version__.split(".")[:2]) < (1, 23),
                    reason="onnx < 1.23 accepts hard-linked external data")
def test_onnx_refuses_hard_linked_external_data(tmp_path: Path, ext_model: Path) -> None:
    """Why ``--weights link`` never hard-links: one more link on the source's data file and
    onnx >= 1.23 refuses to load the user's own model (and every stage) -- ORT and the toolkit
    venvs' onnx 1.16 would not mind, but rkpart's own loaders and checker would."""
    model = _own_copy(tmp_path, ext_model)
    data = model.with_name(model.name + ".data")
    onnx.load(str(model))
    os.link(data, tmp_path / "second.data")
    with pytest.raises(Exception, match="hard link"):
        onnx.load(str(model))


@pytest.mark.parametrize("where", ["tmp", "shm"])
@pytest.mark.parametrize("chunk", [1 << 12, 1 << 23])
def test_write_pieces_writes_and_hashes_exactly_the_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           where: str, chunk: int) -> None:
    """Unaligned slices, padding and inline bytes across buffer boundaries, with ``O_DIRECT``
    (a disk file system) and without it (tmpfs refuses it on older kernels): the file holds
    exactly the pieces, and the hash saw exactly its bytes."""
    import hashlib

    import rkpart.plan.weights as w

    folder = tmp_path if where == "tmp" else Path("/dev/shm")
    if not folder.is_dir():
        pytest.skip("no /dev/shm")
    monkeypatch.setattr(w, "_CHUNK", chunk)
    src = tmp_path / "src.data"
    blob = os.urandom(3 * 4096 + 123)
    src.write_bytes(blob)
    pieces: list[Any] = [("file", src, 5, 1000), ("pad", None, 0, 24), ("bytes", b"inline" * 700, 0, 4200),
                         ("file", src, 1005, len(blob) - 1005), ("pad", None, 0, 7), ("file", src, 0, 1)]
    want = blob[5:1005] + bytes(24) + b"inline" * 700 + blob[1005:] + bytes(7) + blob[:1]
    dst = folder / f"rkpart-test-{os.getpid()}-{chunk}.data"
    dst.write_bytes(b"old contents, longer than nothing")
    try:
        h = hashlib.sha256()
        assert w.write_pieces(pieces, dst, h) == len(want)
        assert dst.read_bytes() == want
        assert h.hexdigest() == hashlib.sha256(want).hexdigest()
    finally:
        dst.unlink()
    (tmp_path / "short.data").touch()
    with pytest.raises(InvalidModelError, match="too short"):
        w.write_pieces([("file", src, len(blob) - 10, 20)], tmp_path / "short.data")


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_write_pieces_falls_back_when_o_direct_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          refused_at: str) -> None:
    """A file system that refuses ``O_DIRECT`` (at ``open``, or only at the first write, as some
    FUSE and network file systems do) gets the same bytes through the page cache.  This disk
    takes ``O_DIRECT``, so the refusal is injected by a *fake* ``os.open`` / ``os.write`` that
    raise ``EINVAL`` while the flag is set, delegating otherwise."""
    import errno
    import fcntl
    import hashlib

    import rkpart.plan.weights as w

    real_open, real_write = os.open, os.write
    refused: list[str] = []

    def fake_open(path: Any, flags: int, *a: Any) -> int:
        if refused_at == "open" and flags & os.O_DIRECT:
            refused.append("open")
            raise OSError(errno.EINVAL, "O_DIRECT refused (fake)")
        return real_open(path, flags, *a)

    def fake_write(fd: int, data: Any) -> int:
        if refused_at == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append("write")
            raise OSError(errno.EINVAL, "O_DIRECT refused (fake)")
        return real_write(fd, data)

    monkeypatch.setattr(w.os, "open", fake_open)
    monkeypatch.setattr(w.os, "write", fake_write)
    src = tmp_path / "src.data"
    blob = os.urandom(5 * 4096 + 77)
    src.write_bytes(blob)
    dst = tmp_path / "dst.data"
    dst.touch()
    h = hashlib.sha256()
    assert w.write_pieces([("file", src, 3, len(blob) - 3), ("pad", None, 0, 9)], dst, h) == len(blob) + 6
    assert refused == [refused_at]
    assert dst.read_bytes() == blob[3:] + bytes(9)
    assert h.hexdigest() == hashlib.sha256(blob[3:] + bytes(9)).hexdigest()
