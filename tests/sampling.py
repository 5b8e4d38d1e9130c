"""Which cases of the large matrices CI runs.

CI (``bash .ci/run``) has 45 minutes on 2 cores for the whole suite, so a matrix whose cases
repeat one mechanism runs a sample there: every mechanism at least once, on the exporter and
toolkit where it mattered.  ``RKPART_FULL_MATRIX=1`` runs every case of every matrix (each skipped
case says so); the older per-module switches (``RKPART_FULL_NPU_MATRIX``, ``RKPART_FULL_SWEEP``)
still run their own module whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
from _pytest.mark.structures import ParameterSet

#: every case of every matrix
FULL = os.environ.get("RKPART_FULL_MATRIX") == "1"


def full_only(*values: object, id: str | None = None, why: str,
              marks: Sequence[pytest.MarkDecorator] = ()) -> ParameterSet:
    """A matrix case CI skips (``why``: which case of the sample covers its mechanism)."""
    skip = pytest.mark.skipif(not FULL, reason=f"CI sample; RKPART_FULL_MATRIX=1 runs it ({why})")
    return pytest.param(*values, id=id, marks=[*marks, skip])
