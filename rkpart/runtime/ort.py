"""ONNX Runtime backend: runs any stage on the CPU; the host backend of every plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rkpart.partitioner.plan import Stage, check_inside
from rkpart.runtime.base import Backend, Feeds, StageRunner


def make_session(model: bytes | str, *, threads: int = 0) -> Any:
    """An ORT CPU session with deterministic settings (sequential execution)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])


class OrtRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, threads: int = 0) -> None:
        super().__init__(stage, folder)
        self._path = check_inside(folder, stage.file, what=f"stage {stage.id} file")
        self._threads = threads
        self._sess: Any = None

    def _load_impl(self) -> None:
        # ORT reads external data itself, relative to the model path; here we only check that
        # the file is there so that a missing file is a load failure, not an init failure.
        if not self._path.is_file():
            from rkpart.errors import SpecError

            raise SpecError(f"stage {self.stage.id}: file {self.stage.file} is missing")

    def _init_impl(self) -> None:
        self._sess = make_session(str(self._path), threads=self._threads)

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        names = [o.name for o in self._sess.get_outputs()]
        outs = self._sess.run(names, feeds)
        return dict(zip(names, outs, strict=True))

    def _release_impl(self) -> None:
        self._sess = None


class OrtBackend(Backend):
    """ONNX Runtime on the CPU.

    ``threads`` sets ORT's intra-op thread count (0: ORT's default, one per core).  On a
    machine shared with other jobs, ``threads=1`` measures a stage's own cost: with the
    default pool a stage's time depends on whether its helper threads got scheduled.
    """

    name = "ort"
    #: a class default too, so subclasses that do not call ``__init__`` keep working
    threads: int = 0

    def __init__(self, threads: int = 0) -> None:
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        self.threads = threads

    def runner(self, stage: Stage, folder: Path) -> StageRunner:
        return OrtRunner(stage, folder, threads=self.threads)

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort

        d: dict[str, Any] = {"backend": self.name, "runtime": f"onnxruntime {ort.__version__}"}
        if self.threads:
            d["intra_op_threads"] = self.threads
        return d
