"""What ``partition`` may resume, replace and delete (issue 13).

- The resume key covers every input of the stages: the model file (by content), its external
  data files (by identity: size, device, inode, modification and change time -- hashing
  gigabytes of weights up front would read every byte twice, see below), the grouping the
  strategy chose (so a changed spec or cost model is seen even when its file name is the
  same), the options and the rkpart version.  The weights' *content* is checked per stage:
  a finished stage is resumed only if its files still hash to the sha256 its source slices
  give now (:mod:`rkpart.plan.write`), so no stale weight byte is ever reused.
- ``--force`` replaces only a folder that validates as an rkpart plan folder: its output
  marker lists every file in it, or (a folder written before the marker existed) a valid
  ``plan.json`` lists every file in it (:func:`plan_listing`); compile's ``rknn/`` aside.
- The staging folder ``.<out>.partial`` is used only if it is a real folder (never through a
  symlink) that an rkpart run left: it has the run key file or a valid plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rkpart.errors import OutputExistsError, SpecError, UserError
from rkpart.io import external_locations, file_sha256, locations_in
from rkpart.output import MARKER, check_staging_path, is_leftover_temp, legacy_problem, owned_problem, read_marker
from rkpart.types import JsonMap

if TYPE_CHECKING:
    import onnx

#: what rkpart writes into a plan folder (partition: plan.json, stages/, the output marker of
#: :mod:`rkpart.output`; pipeline/: the pipeline description; compile: rknn/)
PLAN_FOLDER_ENTRIES = frozenset({"plan.json", "stages", "rknn", "pipeline", MARKER})
#: the output kind in a plan folder's marker; ``compile`` adds ``rknn/`` to such a folder later
PLAN_KIND = "plan"
PLAN_GROWS = ("rknn",)
RUN_KEY_FILE = "run.json"


class _Group(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def ops(self) -> frozenset[int]: ...


def model_files(model: Path, proto: onnx.ModelProto | None = None) -> list[Path]:
    """The model file and its external-data files (already confined by the model loader).

    ``proto``: the parsed model, to avoid parsing it again.
    """
    locs = locations_in(proto) if proto is not None else external_locations(model, what="model", error=UserError)
    return [model, *(model.parent / loc for loc in locs)]


def file_identity(path: Path) -> list[str | int]:
    """What identifies a file's current bytes without reading them: name, size, device, inode,
    modification and change time (``ctime`` moves on every write and ``utime``, and cannot be
    set back by a user)."""
    st = os.stat(path)
    return [path.name, st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def resume_key(model: Path, proto: onnx.ModelProto | None, strategy: str, options: JsonMap,
               groups: Sequence[_Group], *,
               external_threshold: int, simplify: bool, input_shapes: JsonMap | None,
               model_sha256: str | None = None, variant: JsonMap | None = None) -> str:
    """The identity of a partition run: a staging folder written under another key is not reused.

    ``model_sha256``: the model file's sha256 when the caller has it (it is not hashed twice).
    ``variant``: what makes other stages of the same grouping, only where it differs from the
    default (``weights="link"``: a link run's stages are not a copy run's; ``specialised``: stages
    made for other ``--inputs``).
    """
    from rkpart import __version__

    files = model_files(model, proto)
    blob = {
        "rkpart": __version__,
        "model": model_sha256 or file_sha256(model),
        "data": [file_identity(f) for f in files[1:]],
        "strategy": strategy,
        "options": options,
        "groups": [[g.id, g.device, sorted(g.ops)] for g in groups],
        "threshold": external_threshold,
        "simplify": simplify,
        "shapes": {str(k): list(v) for k, v in sorted((input_shapes or {}).items())},
        **dict(variant or {}),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def _is_real_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def plan_listing(folder: Path) -> set[str] | str:
    """The files a plan folder's ``plan.json`` says partition wrote: itself, every stage file and
    its ``.data`` weights (:data:`~rkpart.output.Listing`; compile's ``rknn/`` is judged apart)."""
    from rkpart.plan.plan import load_plan

    try:
        plan, _ = load_plan(folder)
    except SpecError as e:
        return f"its plan.json is not a valid rkpart plan ({e})"
    files = {"plan.json"}
    for s in plan.stages:
        files.update((s.file, f"{s.file}.data"))
    described = plan.extra.get("pipeline")  # the pipeline description partition copied (rkpart.roles)
    if isinstance(described, dict):
        files.update(str(described[k]) for k in ("file", "values") if isinstance(described.get(k), str))
    return files


def plan_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a folder ``--force`` may replace, or ``None`` if it is one.

    A folder with rkpart's output marker is judged by it (:func:`rkpart.output.owned_problem`:
    nothing but the files partition wrote and compile's ``rknn/``); one written before the
    marker existed, by what its valid ``plan.json`` lists (:func:`plan_listing`).
    """
    if read_marker(folder) is not None:
        why = owned_problem(folder, PLAN_KIND, grows=PLAN_GROWS)
        listed = plan_listing(folder)
        return why if why is not None else (listed if isinstance(listed, str) else None)
    if os.path.islink(folder / "rknn"):
        return "rknn is a symlink"
    return legacy_problem(folder, plan_listing, grows=PLAN_GROWS)


def check_out(out: Path, force: bool, model: Path | None = None) -> None:
    """Refuse an output path rkpart must not write into or replace."""
    if out.is_symlink():
        raise OutputExistsError(f"output {out} is a symlink; give the folder it points to "
                                f"({os.path.realpath(out)}) or another path")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output {out} exists and is not a folder")
    if model is not None and out.is_dir():
        m = model.resolve()
        if out.resolve() in m.parents:
            raise OutputExistsError(f"output folder {out} contains the model {model}; choose another folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise OutputExistsError(f"output folder {out} is not empty; use --force to replace it")
        why = plan_folder_problem(out)
        if why is not None:
            raise OutputExistsError(f"refusing to replace {out}: it is not an rkpart plan folder: {why}")


def check_staging(staging: Path, *, contents: bool = True) -> None:
    """Refuse a staging path that is not a real folder an rkpart run left behind.

    ``contents=False`` checks only what is unsafe to lock (a symlink, a non-folder): the
    folder's contents can be judged only once the lock is ours, since a concurrent run
    holding it may be half-way through writing them.
    """
    check_staging_path(staging)
    if not staging.exists():
        return
    if not _is_real_dir(staging):
        raise OutputExistsError(f"staging path {staging} exists and is not a folder; remove it")
    if not contents:
        return
    # a run killed before its first rename leaves only a temp file of its run key
    entries = [p for p in staging.iterdir() if not is_leftover_temp(p)]
    if not entries or (staging / RUN_KEY_FILE).is_file():
        return
    if plan_folder_problem(staging) is None:
        return
    raise OutputExistsError(f"staging path {staging} holds files rkpart did not write; move them away")
