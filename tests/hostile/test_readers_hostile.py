"""Every file a command reads is validated whole, up front (issue 31): a FIFO, ``/dev/zero``, a
sparse multi-GiB file, deep nesting, a 5000-digit integer or bytes that are not the format are
one line with the documented exit code (docs/errors.md), never a hang, a traceback or an
out-of-memory.  Each reader gets every kind of broken file (a generated matrix).
"""

from __future__ import annotations

import io
import os
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result

from rkpart.cost_model.model import default_model_path
from tests.hostile.models import FUZZ_STATS, assert_user_error, cli


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _devzero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of nothing: must be refused by its size, never read


def _bytes(b: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(b)


#: broken files for every JSON / JSON Lines reader
JSON_KINDS: list[tuple[str, Callable[[Path], None]]] = [
    ("fifo", _fifo), ("devzero", _devzero), ("sparse-3GiB", _sparse), ("empty", _bytes(b"")),
    ("not-utf8", _bytes(b"\xff\xfe\x00{")), ("garbage", _bytes(b"\x00\x01 not json")),
    ("deep", _bytes(b"[" * 100_000 + b"]" * 100_000)), ("deep-object", _bytes(b'{"a":' * 200 + b"1" + b"}" * 200)),
    ("digits", _bytes(b'{"format": ' + b"7" * 5000 + b"}")), ("array", _bytes(b"[1, 2, 3]")),
    ("nan-object", _bytes(b'{"format": NaN}')),
]


def _npz(arrays: dict[str, Any], pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _huge_header(p: Path) -> None:
    hdr = io.BytesIO()
    np.lib.format.write_array_header_2_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in ("hidden_states", "timestep", "encoder_hidden_states", "sample"):
            z.writestr(f"{name}.npy", b"\x93NUMPY\x02\x00" + hdr.getvalue()[8:] + b"\x00" * 16)
    p.write_bytes(buf.getvalue())


#: broken files for every .npz reader
NPZ_KINDS: list[tuple[str, Callable[[Path], None]]] = [
    ("fifo", _fifo), ("devzero", _devzero), ("sparse-3GiB", _sparse), ("empty", _bytes(b"")),
    ("garbage", _bytes(b"PK\x03\x04 but not really")), ("huge-header", _huge_header),
    ("pickled", _bytes(_npz({n: np.array([{}], dtype=object) for n in ("hidden_states", "sample")}))),
    ("structured", _bytes(_npz({n: np.zeros(2, dtype=[("a", "<f4")]) for n in ("hidden_states", "sample")}))),
    ("no-arrays", _bytes(_npz({}))),
]

#: reader -> (argv with {f} for the broken file, which kinds, exit code)
READERS: dict[str, tuple[list[str], list[tuple[str, Callable[[Path], None]]], int]] = {
    "fit-profile": (["fit", "{f}", "-o", "{tmp}/m.json"], JSON_KINDS, 5),
    "fit-base": (["fit", "{profile}", "--base", "{f}", "-o", "{tmp}/m.json"], JSON_KINDS, 5),
    "profile-show": (["profile", "--show", "{f}"], JSON_KINDS, 5),
    "profile-against": (["profile", "--show", "{profile}", "--against", "{f}"], JSON_KINDS, 5),
    "report-profile": (["report", "{plan}", "{f}", "-o", "{tmp}/r.html", "-q"], JSON_KINDS, 5),
    "report-run": (["report", "{plan}", "--run", "{f}", "-o", "{tmp}/r.html", "-q"], JSON_KINDS, 5),
    "report-cost-model": (["report", "{plan}", "{profile}", "--cost-model", "{f}", "-o", "{tmp}/r.html", "-q"],
                          JSON_KINDS, 5),
    "partition-cost-model": (["partition", "-s", "auto", "--cost-model", "{f}", "-o", "{tmp}/a", "-q"],
                             JSON_KINDS, 5),
    "run-inputs": (["run", "{plan}", "--inputs", "{f}", "-q"], NPZ_KINDS, 2),
    "run-reference": (["run", "{plan}", "--reference", "{f}", "-q"], NPZ_KINDS, 2),
    "bundle-inputs": (["bundle", "{plan}", "-o", "{tmp}/b", "--inputs", "{f}", "-q"], NPZ_KINDS, 2),
}

#: in the fast tier: every kind for one JSON and one npz reader, the kinds that hung or exhausted
#: memory before (FIFO, /dev/zero, sparse) for every reader; the rest with the slow tests
_FAST_READERS = {"fit-profile", "run-inputs"}
_FAST_KINDS = {"fifo", "devzero", "sparse-3GiB"}
CASES = [(reader, kind) if reader in _FAST_READERS or kind in _FAST_KINDS
         else pytest.param(reader, kind, marks=pytest.mark.slow)
         for reader, (_a, kinds, _c) in READERS.items() for kind, _f in kinds]


def _invoke(args: list[str]) -> Result:
    """``cli(args)`` in a thread: a reader blocked on a FIFO fails the test instead of hanging it."""
    done: list[Result] = []
    t = threading.Thread(target=lambda: done.append(cli(args)), daemon=True)
    t.start()
    t.join(timeout=60)
    assert done, f"blocked: rkpart {' '.join(args)}"
    return done[0]


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize(("reader", "kind"), CASES)
def test_every_reader_refuses_every_broken_file_in_one_line(reader: str, kind: str, split_plan: Path,
                                                            profile: Path, tmp_path: Path) -> None:
    argv, kinds, code = READERS[reader]
    bad = tmp_path / ("bad.npz" if kinds is NPZ_KINDS else "bad.json")
    dict(kinds)[kind](bad)
    args = [a.format(f=bad, tmp=tmp_path, plan=split_plan, profile=profile) for a in argv]
    r = _invoke(args)
    if reader == "bundle-inputs" and code == 2 and r.exit_code == 5:
        pytest.fail(f"bundle --inputs gave 5: {r.output}")
    assert_user_error(r, code)
    written = sorted(p.name for p in tmp_path.iterdir() if p != bad)
    assert written == [], written  # nothing written on a refused input
    FUZZ_STATS[f"cases:readers-{reader.split('-')[0]}"] += 1


@pytest.mark.slow  # reads the shared profile (an ONNX Runtime profiling run)
def test_the_good_files_pass_the_same_readers(split_plan: Path, profile: Path, tmp_path: Path) -> None:
    """The control: with a real profile, cost model and inputs every reader above succeeds."""
    r = cli(["profile", "--show", profile, "--against", default_model_path()])
    assert r.exit_code == 0, r.output
    inputs = tmp_path / "in.npz"
    r = cli(["run", split_plan, "--save-outputs", tmp_path / "out.npz", "-q"])
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "out.npz") as z:
        assert z.files
    from rkpart.plan.plan import load_plan
    from rkpart.runtime.executor import random_inputs

    p, _ = load_plan(split_plan)
    np.savez(inputs, **random_inputs(p.tensors, p.inputs, 0))
    r = cli(["run", split_plan, "--inputs", inputs, "-q"])
    assert r.exit_code == 0, r.output
