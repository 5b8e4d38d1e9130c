"""Open a plan's stage and artifact files only after checking them (issue 13).

Every command that reads a file a plan names goes through :func:`stage_onnx` or
:func:`artifact_file`: the path is confined to the plan folder and must be a regular file
(:func:`rkpart.io.confined_file`), a stage's external data must be its own ``<file>.data``
next to it or, in a ``--weights link`` plan, a shared file under ``stages/weights/``, and the
bytes must still match the sha256 that ``partition`` (or ``compile``) recorded (for a link
stage: its ``.onnx``, which names the shared file's offsets and lengths, and its own data),
so a swapped or edited stage is refused instead of silently compiled or run.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path, PurePosixPath

from rkpart.errors import SpecError
from rkpart.io import confined_file, file_sha256, onnx_with_data
from rkpart.plan.extract import stage_sha256
from rkpart.plan.plan import Artifact, Stage
from rkpart.plan.weights import LINK_DIR

# files already hashed, by identity (ctime cannot be set back by a user): profile rounds and
# per-stage comparisons open the same stage many times
_Ident = tuple[tuple[str, int, int, int, int, int], ...]
_verified: dict[tuple[str, _Ident], str] = {}
_lock = threading.Lock()


def _identity(paths: list[Path]) -> _Ident:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def _digest(paths: list[Path], compute: str) -> str:
    ident = (compute, _identity(paths))
    with _lock:
        hit = _verified.get(ident)
    if hit is not None:
        return hit
    d = stage_sha256(paths[0]) if compute == "stage" else file_sha256(paths[0])
    with _lock:
        _verified[ident] = d
    return d


def stage_onnx(folder: str | os.PathLike[str], stage: Stage, *, verify: bool = True) -> Path:
    """The stage's ``.onnx`` path after the confinement, external-data and sha256 checks.

    Raises :class:`SpecError` naming the stage and what is wrong.
    """
    folder = Path(folder)
    what = f"stage {stage.id} file"
    files = onnx_with_data(folder, stage.file, what=what)
    onnx_path = files[0]
    own = onnx_path.with_name(onnx_path.name + ".data")
    shared = onnx_path.parent / LINK_DIR  # --weights link: the model's data files, shared by the stages
    for f in files[1:]:
        if f != own and shared not in f.parents:
            raise SpecError(f"stage {stage.id}: external data {f.relative_to(folder)} is not the stage's own "
                            f"data file {PurePosixPath(stage.file).name}.data nor under "
                            f"{PurePosixPath(stage.file).parent / LINK_DIR}/")
    if os.path.lexists(own):
        confined_file(folder, str(PurePosixPath(stage.file).with_name(own.name)),
                      what=f"stage {stage.id} data file")
    if verify:
        hashed = [onnx_path, own] if own.exists() else [onnx_path]
        if _digest(hashed, "stage") != stage.sha256:
            raise SpecError(f"stage {stage.id}: {stage.file} does not match the sha256 in plan.json "
                            "(edited or swapped since partition); rerun rkpart partition")
    return onnx_path


def prepared_onnx(folder: str | os.PathLike[str], stage: Stage, *, verify: bool = True) -> Path:
    """The file the toolkit builds and rknn-sim loads for ``stage``, checked like :func:`stage_onnx`.

    That is the prepared copy ``compile`` recorded (``rknn/prepared/...``: lowered opset, NPU
    rewrites) when there is one, confined to the plan folder and matching its recorded sha256;
    otherwise the stage file itself.
    """
    rec = stage.prepared
    if not rec:
        return stage_onnx(folder, stage, verify=verify)
    file, sha = rec.get("file"), rec.get("sha256")
    if not isinstance(file, str) or not isinstance(sha, str):
        raise SpecError(f"stage {stage.id}: its prepared copy has no file or sha256 in plan.json; "
                        "rerun rkpart compile")
    copy = dataclasses.replace(stage, id=f"{stage.id} (prepared copy)", file=file, sha256=sha)
    try:
        return stage_onnx(folder, copy, verify=verify)
    except SpecError as e:
        raise SpecError(str(e).replace("rerun rkpart partition", "rerun rkpart compile")) from None


def artifact_file(folder: str | os.PathLike[str], stage: Stage, art: Artifact, *, verify: bool = True) -> Path:
    """An artifact's path after the confinement and sha256 checks."""
    folder = Path(folder)
    path = confined_file(folder, art.file, what=f"stage {stage.id} artifact")
    if verify and _digest([path], "file") != art.sha256:
        raise SpecError(f"stage {stage.id}: artifact {art.file} does not match the sha256 in plan.json "
                        "(corrupted or replaced); rerun rkpart compile")
    return path
