"""Target capabilities: what one chip, built by one rknn-toolkit2 version, can run.

Consulted *before* anything is compiled, as ONNX Runtime's ``GetCapability`` and torch.fx's
``OperatorSupport`` are: strategies take their default memory budget from here, selection
excludes candidates whose patterns a toolkit crashes on, and the pipeline checks ops and
opset against the toolkit.  ``rkpart compile`` / ``rkpart repro`` name failures from the same
known-issue table.

Layout (one module per target, as TVM's ``relay/op/contrib/<target>.py``):

``base.py``          :class:`Target`, :class:`ToolkitCaps`, :class:`OpRule`, :class:`Support`
``known_issues.py``  the ONE table of toolkit bugs: crash patterns and log signatures
``rk3588.py``        RK3588 facts, with their sources
``opset.py``         lowering: bring a stage to a toolkit's ``max_opset`` (version_converter + rewrites)
``rewrites/``        the ONE table of graph rewrites (opset lowering, NPU placement, crash
                     workarounds), with evidence; written on :class:`rkpart.ir.edit.GraphEdit`

Layer: above :mod:`rkpart.ir`, below the partitioner; imports nothing else of rkpart but
:mod:`rkpart.errors`, :mod:`rkpart.types` and :mod:`rkpart.ir`.
"""

from __future__ import annotations

from rkpart.errors import UserError
from rkpart.targets.base import OpRule, Support, Target, ToolkitCaps
from rkpart.targets.known_issues import KNOWN_ISSUES, CrashPattern, KnownIssue
from rkpart.targets.rk3588 import RK3588

#: every target by name (``RKNN.config(target_platform=...)`` spelling)
TARGETS: dict[str, Target] = {RK3588.name: RK3588}
DEFAULT_TARGET = RK3588.name


def get_target(name: str | None = None) -> Target:
    """The target called ``name`` (default :data:`DEFAULT_TARGET`).

    Raises
    ------
    UserError
        ``name`` is not a known target; the message lists the known ones.
    """
    key = (name or DEFAULT_TARGET).lower()
    if key not in TARGETS:
        raise UserError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return TARGETS[key]


__all__ = ["DEFAULT_TARGET", "KNOWN_ISSUES", "TARGETS", "CrashPattern", "KnownIssue", "OpRule", "Support", "Target",
           "ToolkitCaps", "get_target"]
