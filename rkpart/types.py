"""Vocabulary shared across package borders: where a stage runs and how its sessions live.

A leaf module (it imports nothing from rkpart) so every layer, from the IR up to the CLI,
can name these types without creating an import edge upwards.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal

#: where a stage runs: an NPU stage is compiled by rknn-toolkit2, a host stage runs in ONNX Runtime
Device = Literal["npu", "host"]
NPU: Final = "npu"
HOST: Final = "host"
DEVICES: Final[tuple[Device, ...]] = ("npu", "host")


class Residency(str, Enum):
    """How long a stage's runtime session lives during a round of passes."""

    #: loaded, initialised, run and released around each use (what the write-up measured)
    PER_STAGE = "per-stage"
    #: loaded once per round and kept for every pass and step
    RESIDENT = "resident"

    def __str__(self) -> str:
        return self.value


RESIDENCIES: Final[tuple[str, ...]] = tuple(r.value for r in Residency)
