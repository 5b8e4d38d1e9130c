"""rknn-toolkit2 environments: one virtual environment per toolkit version.

rknn-toolkit2 pins numpy 1.x, protobuf 4.x and an old onnx, which cannot live next to
rkpart's own dependencies; and it crashes, hangs or eats memory on some graphs.  So it is
never imported here: each version gets its own venv under a toolkits root, and rkpart talks
to it only through subprocesses running :mod:`rkpart.compile.worker_main`.

Layout of the root (default ``$RKPART_TOOLKITS_DIR`` or ``~/.cache/rkpart/toolkits``)::

    <root>/<version>/toolkit.json     {"version": ..., "python": ..., "managed": true}
    <root>/<version>/venv/            the managed venv (absent for a registered python)
    <root>/<version>/install.log      pip output of the installation

A version directory without ``toolkit.json`` does not exist as far as rkpart is concerned:
installation happens in a temporary sibling directory that is renamed into place last.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rkpart.errors import ToolkitError, UserError
from rkpart.io import atomic_write_bytes
from rkpart.progress import Progress, advance
from rkpart.readers import FileKind

#: versions known to install with the recipe below (others are attempted with the same pins)
KNOWN_VERSIONS = ("2.2.0", "2.3.0", "2.3.2", "2.5.0")
MARKER = "toolkit.json"
TORCH_VERSION = "2.13.0"

# The toolkit's own requirement files pin torch<=2.4 and friends, which would pull a
# multi-GB CUDA build; installing it with --no-deps and then a hand-checked set that works
# for 2.3.0, 2.3.2 and 2.5.0 (onnx 1.16.1 satisfies all three) avoids the resolver entirely.
# setuptools<70 because the toolkit imports pkg_resources at import time.
DEPENDENCIES = (
    "numpy==1.26.4",
    "protobuf==4.25.4",
    "onnx==1.16.1",
    "onnxruntime==1.18.1",
    "psutil",
    "ruamel.yaml",
    "scipy",
    "tqdm",
    "fast-histogram",
    "opencv-python-headless",
    "setuptools<70",
    # torch's own dependencies, because torch itself is installed with --no-deps (it wants
    # setuptools>=77, which would remove pkg_resources)
    "filelock",
    "typing-extensions",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
)


_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}([a-z0-9.+-]*)?$")


@dataclass(frozen=True)
class Toolkit:
    """One usable rknn-toolkit2 installation."""

    version: str
    python: Path
    managed: bool  # True: a venv rkpart created; False: a user's python registered by path
    home: Path | None = None  # the version directory under the toolkits root

    def describe(self) -> str:
        where = "managed venv" if self.managed else "registered python"
        return f"rknn-toolkit2 {self.version} ({where}: {self.python})"


def toolkits_root(override: str | os.PathLike[str] | None = None) -> Path:
    """The toolkits directory: ``override``, ``$RKPART_TOOLKITS_DIR`` or ``~/.cache/rkpart/toolkits``."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("RKPART_TOOLKITS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "rkpart" / "toolkits"


def _check_version(version: str) -> str:
    if not _VERSION_RE.match(version):
        raise ToolkitError(
            f"{version!r} is not a toolkit version; expected e.g. {', '.join(KNOWN_VERSIONS)}"
        )
    return version


#: what ``rkpart toolkit install`` records in a toolkit's folder; an unreadable one is no toolkit
MARKER_KIND = FileKind("toolkit marker", "json", 1 << 20, UserError, symlinks=False,
                       doc="`$RKPART_TOOLKITS_DIR/<version>/...`, what `toolkit install` records")


def _read_marker(d: Path) -> Toolkit | None:
    try:
        data = MARKER_KIND.load(d / MARKER, root=d)
        return Toolkit(
            version=str(data["version"]),
            python=Path(data["python"]),
            managed=bool(data.get("managed", False)),
            home=d,
        )
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None


def list_toolkits(root: str | os.PathLike[str] | None = None) -> list[Toolkit]:
    """Installed or registered toolkits under ``root``, sorted by version."""
    r = toolkits_root(root)
    if not r.is_dir():
        return []
    found = [t for d in sorted(r.iterdir()) if d.is_dir() and not d.name.startswith(".")
             if (t := _read_marker(d)) is not None]
    return sorted(found, key=lambda t: _version_key(t.version))


def _version_key(v: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", v))


def find_toolkit(spec: str, root: str | os.PathLike[str] | None = None) -> Toolkit:
    """Resolve ``spec`` (a version such as ``2.3.0``, or the path of a python) to a toolkit.

    Raises
    ------
    ToolkitError
        When the version is not installed (the message lists what is) or the python has no
        rknn-toolkit2.
    """
    if os.sep in spec or spec.startswith("."):
        python = Path(spec).expanduser()
        return Toolkit(version=detect_version(python), python=python, managed=False)
    _check_version(spec)
    d = toolkits_root(root) / spec
    tk = _read_marker(d)
    if tk is None:
        have = ", ".join(t.version for t in list_toolkits(root)) or "none"
        raise ToolkitError(
            f"rknn-toolkit2 {spec} is not installed in {toolkits_root(root)} (installed: {have}); "
            f"run `rkpart toolkit install {spec}`"
        )
    if not tk.python.exists():
        raise ToolkitError(
            f"rknn-toolkit2 {spec}: its python {tk.python} is gone; reinstall with "
            f"`rkpart toolkit install {spec} --force`"
        )
    return tk


def toolkit_version(toolkit: Toolkit | str | None) -> str | None:
    """The rknn-toolkit2 version ``toolkit`` names: a :class:`Toolkit`'s, a version as written, else the
    version :func:`find_toolkit` finds for it (the python at a path); ``None`` stays ``None`` (the
    target's default).  What the partition's capability is asked by
    (:func:`rkpart.grouping.learned.target_capability`)."""
    version = toolkit.version if isinstance(toolkit, Toolkit) else toolkit
    if version is not None and not version.replace(".", "").isdigit():
        version = find_toolkit(version).version
    return version


def detect_version(python: Path) -> str:
    """Ask ``python`` (in a subprocess) which rknn-toolkit2 it has, without importing it."""
    if not python.is_file():
        raise ToolkitError(f"{python} is not a python executable")
    code = "import importlib.metadata as m; print(m.version('rknn-toolkit2'))"
    try:
        p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60,
                           check=False)
    except OSError as e:
        raise ToolkitError(f"cannot run {python}: {e}") from None
    if p.returncode != 0:
        raise ToolkitError(f"{python} has no rknn-toolkit2 installed (pip show rknn-toolkit2 finds nothing)")
    return p.stdout.strip()


def register_toolkit(python: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                     *, version: str | None = None, force: bool = False) -> Toolkit:
    """Register a user's existing python (with rknn-toolkit2 installed) under the toolkits root."""
    py = Path(python).expanduser().absolute()
    found = detect_version(py)
    if version is not None and version != found:
        raise ToolkitError(f"{py} has rknn-toolkit2 {found}, not {version}")
    _verify_import(py, found)
    r = toolkits_root(root)
    d = r / found
    if (d / MARKER).exists() and not force:
        raise ToolkitError(f"rknn-toolkit2 {found} is already set up in {d}; pass --force to replace it")
    r.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{found}.", dir=r))
    _write_marker(tmp, found, py, managed=False)
    _swap_into_place(tmp, d)
    tk = _read_marker(d)
    assert tk is not None
    return tk


def _write_marker(d: Path, version: str, python: Path, *, managed: bool) -> None:
    data = {"version": version, "python": str(python), "managed": managed}
    atomic_write_bytes(d / MARKER, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def _swap_into_place(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def find_torch_wheel(python_tag: str = "cp311") -> str:
    """A local torch CPU wheel if one is around (``$RKPART_WHEELS_DIR``, ``/opt/wheels``), else a pin.

    Asking PyPI for torch downloads a multi-GB CUDA build, so a local CPU wheel is preferred.
    """
    dirs = [os.environ.get("RKPART_WHEELS_DIR", ""), "/opt/wheels"]
    for d in dirs:
        if not d:
            continue
        hits = sorted(glob.glob(os.path.join(d, f"torch-{TORCH_VERSION}*-{python_tag}-{python_tag}-*.whl")))
        if hits:
            return hits[-1]
    return f"torch=={TORCH_VERSION}"


def install_steps(version: str, python: Path, python_tag: str) -> list[tuple[str, list[str]]]:
    """The pip commands (argv lists) that install ``version`` into the venv of ``python``."""
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    return [
        (f"rknn-toolkit2=={version}", [*pip, "--no-deps", f"rknn-toolkit2=={version}"]),
        ("dependencies", [*pip, *DEPENDENCIES]),
        ("torch (CPU)", [*pip, "--no-deps", find_torch_wheel(python_tag)]),
    ]


def install_toolkit(version: str, root: str | os.PathLike[str] | None = None, *,
                    base_python: str | os.PathLike[str] | None = None, force: bool = False,
                    progress: Progress | None = None) -> Toolkit:
    """Create a venv with rknn-toolkit2 ``version`` under the toolkits root.

    The venv is built in a temporary sibling directory and renamed into place only after
    ``from rknn.api import RKNN`` works in it, so an interrupted or failed installation
    leaves nothing behind.  Returns the existing toolkit unchanged unless ``force``.

    Raises
    ------
    ToolkitError
        A pip step failed (the message names the step and the log file) or the import check
        failed.
    """
    _check_version(version)
    say = progress or (lambda _m: None)
    r = toolkits_root(root)
    final = r / version
    existing = _read_marker(final)
    if existing is not None and not force:
        say(f"rknn-toolkit2 {version} already installed: {existing.python}")
        return existing
    r.mkdir(parents=True, exist_ok=True)
    base = Path(base_python) if base_python else Path(sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.install.", dir=r))
    log_path = tmp / "install.log"
    t0 = time.monotonic()
    ok = False
    try:
        with open(log_path, "wb") as log:
            say(f"[1/5] creating venv ({base})")
            advance(progress, 0, 5)
            _run_step("venv", [str(base), "-m", "venv", str(tmp / "venv")], log, log_path)
            py = tmp / "venv" / "bin" / "python"
            tag = _python_tag(py)
            steps = install_steps(version, py, tag)
            for i, (what, argv) in enumerate(steps, start=2):
                advance(progress, i - 1, 5)
                say(f"[{i}/5] installing {what}  ({time.monotonic() - t0:.0f} s)")
                _run_step(what, argv, log, log_path)
            advance(progress, 4, 5)
            say(f"[5/5] checking `from rknn.api import RKNN`  ({time.monotonic() - t0:.0f} s)")
        _verify_import(py, version)
        advance(progress, 5, 5)
        # The marker names the final location; the venv works after the rename because the
        # interpreter finds pyvenv.cfg relative to itself and rkpart never runs its scripts.
        _write_marker(tmp, version, final / "venv" / "bin" / "python", managed=True)
        _swap_into_place(tmp, final)
        ok = True
    finally:
        if not ok:
            kept = r / f".{version}.failed-install.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(log_path, kept)
            shutil.rmtree(tmp, ignore_errors=True)
    tk = _read_marker(final)
    assert tk is not None
    say(f"installed rknn-toolkit2 {version} in {time.monotonic() - t0:.0f} s: {tk.python}")
    return tk


def _python_tag(python: Path) -> str:
    code = "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return p.stdout.strip()


def _run_step(what: str, argv: Sequence[str], log: BinaryIO, log_path: Path) -> None:
    log.write(f"$ {' '.join(argv)}\n".encode())
    log.flush()
    p = subprocess.run(list(argv), stdout=log, stderr=subprocess.STDOUT, check=False)
    if p.returncode != 0:
        tail = _tail(log_path)
        raise ToolkitError(f"installing {what} failed (exit {p.returncode}): {tail}")


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errs = [ln for ln in lines if "ERROR" in ln or "error" in ln]
    return (errs or lines or ["no output"])[-1].strip()[:300]


def _verify_import(python: Path, version: str) -> None:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="rkpart-home-") as home:
        env["HOME"] = home
        p = subprocess.run([str(python), "-c", "from rknn.api import RKNN"], capture_output=True,
                           text=True, env=env, timeout=300, check=False)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"rknn-toolkit2 {version} does not import in {python}: {last}")
