"""``rkpart profile PLAN`` as a library call: one frozen :class:`ProfileOptions` in, a ``ProfileRun`` out.

:func:`run_profile` loads the plan, picks the backends, warns about runtime mismatches,
calls :func:`rkpart.profile.lifecycle.profile_plan` and writes the JSON Lines file
atomically.  The click command (:mod:`rkpart.commands.profile`) only parses options into
:class:`ProfileOptions` and prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rkpart.profile.lifecycle import ProfileOptions
from rkpart.profile.records import ProfileRun
from rkpart.progress import Progress, silent
from rkpart.runtime import get_backend
from rkpart.types import JsonObject


def runtime_warnings(plan: Any, env: JsonObject) -> list[str]:
    """Stages built by a toolkit whose version differs from the runtime that will run them.

    Only the board runtime (``rknnlite``) loads the ``.rknn`` files; an ``Invalid RKNN model
    version`` at init is the usual symptom of a mismatch, so say it before profiling starts.
    """
    if env.get("backend") != "rknnlite":
        return []
    from rkpart.triage.compat import check_runtime_compat

    runtime = env.get("runtime")
    return check_runtime_compat(plan, str(runtime) if runtime else None)


def run_profile(opts: ProfileOptions, progress: Progress | None = None,
                warn: Callable[[str], None] | None = None) -> ProfileRun:
    """Load the plan, profile it and write the records atomically to ``opts.output``.

    ``warn`` receives what the user should know before the numbers are trusted (artifacts
    built by another toolkit than the board runtime); default: ``progress``.
    """
    from rkpart.output import check_file_target
    from rkpart.plan.plan import load_plan
    from rkpart.profile.lifecycle import profile_plan
    from rkpart.profile.records import write_jsonl

    if opts.output is None:
        raise ValueError("run_profile needs ProfileOptions.output: where the records go")
    check_file_target(opts.output, force=True, what="profile output")  # before minutes of profiling
    plan, folder = load_plan(opts.plan)
    backend = get_backend(opts.backend, toolkit=opts.toolkit, core_mask=opts.core_mask, threads=opts.threads)
    from rkpart.runtime.ort import OrtBackend

    # host stages always run on ONNX Runtime; --threads applies to them too
    host_backend = OrtBackend(threads=opts.threads)
    for warning in runtime_warnings(plan, backend.describe()):
        (warn or progress or silent)(warning)
    try:
        run = profile_plan(plan, folder, opts, backend, host_backend=host_backend, progress=progress)
    finally:
        backend.close()
    write_jsonl(opts.output, run.to_json())
    return run


__all__ = ["ProfileOptions", "run_profile", "runtime_warnings"]
