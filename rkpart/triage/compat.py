"""Toolkit/runtime compatibility: warn when the board's runtime differs from the toolkit that built a stage.

Every ``.rknn`` artifact in a plan records the rknn-toolkit2 version that built it
(:class:`rkpart.plan.plan.Artifact.toolkit`).  On the board the model is loaded by
librknnrt / rknn-toolkit-lite2, whose version need not match.  Rockchip only promises that a
runtime loads models of its own or an older toolkit, so a model from a *newer* toolkit is
the risky case; an older one usually loads.  Either way the user should know.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rkpart.plan.plan import Plan
from rkpart.triage.matrix import version_key

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_MAX_LISTED = 4


def parse_runtime_version(text: str) -> str | None:
    """``2.3.0`` from ``2.3.0``, ``v2.3.0``, ``librknnrt version: 2.3.0 (c949ad889d@2024-11-07)``."""
    m = _VERSION.search(text)
    if m is None:
        return None
    return ".".join(x for x in m.groups() if x is not None)


def _stages_text(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_MAX_LISTED])
    more = len(ids) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def check_runtime_compat(plan: Plan, runtime_version: str | None) -> list[str]:
    """Warnings (one per toolkit version that differs from ``runtime_version``); empty when all match.

    Parameters
    ----------
    plan
        A compiled plan: its NPU stages' ``rknn`` artifacts say which toolkit built them.
    runtime_version
        The board's runtime version as reported (``rknn_query`` / RKNNLite), free-form;
        ``None`` when unknown (nothing to check).

    Examples
    --------
    >>> check_runtime_compat(plan, "2.3.0")  # doctest: +SKIP
    ['stage b00.block was built by rknn-toolkit2 2.5.0 but the board runtime is 2.3.0: ...']
    """
    if runtime_version is None:
        return []
    runtime = parse_runtime_version(runtime_version)
    if runtime is None:
        return [f"cannot read the board runtime version from {runtime_version!r}; "
                f"toolkit/runtime compatibility not checked"]
    by_toolkit: dict[str, list[str]] = {}
    for s in plan.stages:
        for a in s.artifacts:
            if a.kind == "rknn" and a.toolkit != runtime:
                by_toolkit.setdefault(a.toolkit, []).append(s.id)
    warnings = []
    rk = version_key(runtime)
    for tk in sorted(by_toolkit, key=version_key):
        ids = by_toolkit[tk]
        what = f"stage{'s' if len(ids) > 1 else ''} {_stages_text(ids)}"
        built = f"built by rknn-toolkit2 {tk} but the board runtime is {runtime}"
        tkk = version_key(tk)
        if tkk[:2] > rk[:2]:
            warnings.append(f"{what} {built}: a runtime older than the toolkit may refuse or misrun the model; "
                            f"update librknnrt on the board to {tk} or rebuild with `rkpart compile --toolkit "
                            f"{runtime}`")
        elif tkk[:2] < rk[:2]:
            warnings.append(f"{what} {built}: newer runtimes usually load older models, but check the numerics "
                            f"(`rkpart run`) or rebuild with `rkpart compile --toolkit {runtime}`")
        else:
            warnings.append(f"{what} {built} (patch versions differ)")
    return warnings
