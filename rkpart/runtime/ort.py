"""ONNX Runtime backend: runs any stage on the CPU; the host backend of every plan.

Sessions are created with intra-op thread *spinning off*.  ORT's worker threads otherwise
busy-wait for a while after every ``run``; a plan keeps one session per stage, so the idle
pools of the other stages spin against the pool doing the work.  Measured on this 2-core
machine (``bench/runtime_overhead.py``): a resident split plan of a 2-block hidden-2048 model
ran at 2.3x the whole model with spinning and 1.0x without, and the whole model itself got
faster too (no spinning pool competing with the memory sampler and other processes).

With the default thread count (``threads=0``), small host stages (gates, residual adds, AdaLN
of a small model: under :data:`SMALL_HOST_BYTES` of inputs, outputs and weights) get ONE
intra-op thread: waking a pool costs more than their work (measured on the bundled example:
resident plan 1.40x -> 1.29x the whole model's CPU time).  Large host stages keep ORT's
default pool.

The first session made in a process sets glibc's malloc thresholds so that memory freed by a
released session stays in the process and the next one reuses it
(:mod:`rkpart.runtime.malloc`; ``RKPART_KEEP_FREED_MEMORY=0`` turns it off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # onnx is imported where a stage is read
    import onnx

from rkpart.errors import SpecError, first_line
from rkpart.plan.plan import Stage
from rkpart.plan.verify import stage_onnx
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.runtime.malloc import arena_wanted, keep_freed_memory
from rkpart.types import HOST, JsonObject

#: host stages touching fewer bytes than this run on one intra-op thread when ``threads=0``
SMALL_HOST_BYTES = 1 << 20


def stage_threads(stage: Stage, threads: int) -> int:
    """Intra-op threads for ``stage``: ``threads`` if set, else 1 for a small host stage, else ORT's default (0)."""
    if threads or stage.device != HOST:
        return threads
    return 1 if stage.io_bytes + stage.weight_bytes < SMALL_HOST_BYTES else 0


def make_session(model: bytes | str, *, threads: int = 0, spinning: bool = False,
                 external_folder: Path | None = None) -> Any:
    """An ORT CPU session with deterministic settings (sequential execution, no spinning, no
    memory pattern; no CPU arena while freed memory is kept).

    ORT's memory pattern makes a session's *second* run allocate the whole planned block as
    fresh pages: measured on this machine (one thread, median process CPU time of 6 fresh
    sessions, twice), a fused Anima block at hidden 256 / 1024 tokens took 18.1-22.8 ms on the
    first call, 25.5 ms on the second and 17.3-17.6 ms after; without the pattern 18.2-19.2 /
    17.5-18.0 / 17.4-17.5 ms.  A CFG round of a resident plan is exactly those two calls, so
    the pattern cost it ~20 % for nothing.

    The first call in a process applies :func:`rkpart.runtime.malloc.keep_freed_memory`; while
    that is in effect the session has no CPU arena (except in memory profiles,
    :func:`rkpart.runtime.malloc.measuring_memory`).  The arena grows by doubling regions, and a
    region of 32 MiB or more is mapped by glibc whatever the threshold and unmapped when the
    session is released, so a fresh session page-faulted it in again: a fused block at hidden
    384 / 1024 tokens, first call of a fresh session, 42-43 ms and ~6,300 minor faults with the
    arena, 32-33 ms and 16 faults without (later calls of one session 32-34 ms either way;
    ``bench/fresh_session.py``).  Without the arena ORT mallocs each buffer, below the
    threshold, from the heap glibc now keeps.

    ``external_folder``: where a model given as bytes has its external data (ORT reads it from
    there itself, so the weights are not copied into the bytes).

    A model ORT refuses for a bfloat16 op its CPU provider has no kernel for (``Mul``,
    ``MatMul``, ``Softmax``, ``Sqrt``: Sana-WM's camera attention) is run with its bfloat16
    islands emulated: each op in float32, its result rounded to bfloat16.
    """
    import onnxruntime as ort

    arena = arena_wanted()  # applies keep_freed_memory() on the first call

    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_mem_pattern = False
    if not arena:
        so.enable_cpu_mem_arena = False
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if external_folder is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_folder))
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e):
            raise
        emulated = _bfloat16_emulated(model)
        if emulated is None:
            raise
        if isinstance(model, str) and external_folder is None:
            so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                        str(Path(model).parent))
        return ort.InferenceSession(emulated, sess_options=so, providers=["CPUExecutionProvider"])


def _bfloat16_emulated(model: bytes | str) -> bytes | None:
    """``model`` with its bfloat16 islands run as float32 rounded to bfloat16 after each op
    (:func:`rkpart.targets.rewrites.precision.emulate_bfloat16`: the CPU provider has no bfloat16
    ``Mul``, ``MatMul``, ``Softmax``, ``Sqrt``), or ``None`` when it holds none.  External data is
    not read: a bfloat16 weight stored outside is cast where it is read."""
    import onnx

    from rkpart.targets.rewrites.precision import emulate_bfloat16

    m = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
    if not emulate_bfloat16(m):
        return None
    return m.SerializeToString()


@contextlib.contextmanager
def ort_errors(what: str) -> Iterator[None]:
    """ONNX Runtime's errors (a garbage stage file, inputs of the wrong dtype, shape or rank
    because plan.json was edited) as one-line :class:`SpecError` naming ``what``."""
    try:
        yield
    except (RuntimeError, ValueError, TypeError) as e:
        raise SpecError(f"{what}: ONNX Runtime: {first_line(e)}") from None
    except Exception as e:  # ORT pybind errors (Fail, InvalidArgument, ...) have no common base; re-raised if not ORT
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        raise SpecError(f"{what}: ONNX Runtime: {first_line(e)}") from None


class OrtRunner(StageRunner):
    def __init__(self, stage: Stage, folder: Path, threads: int = 0) -> None:
        super().__init__(stage, folder)
        # ORT reads external data itself, relative to the model path: check the stage and its
        # data (confined, regular files, sha256 as recorded) before ORT opens anything; here,
        # not in load(), so the profiler's load time does not include hashing
        self._path = stage_onnx(folder, stage)
        self._threads = stage_threads(stage, threads)
        self._sess: Any = None
        self._names: list[str] = []

    def _load_impl(self) -> None:
        pass  # checked in __init__

    def _init_impl(self) -> None:
        with ort_errors(f"stage {self.stage.id} ({self.stage.file})"):
            self._sess = make_session(str(self._path), threads=self._threads)
        self._names = [o.name for o in self._sess.get_outputs()]

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        with ort_errors(f"stage {self.stage.id} (does plan.json match its file?)"):
            return dict(zip(self._names, self._sess.run(self._names, feeds), strict=True))

    def infer_into(self, env: dict[str, np.ndarray]) -> None:
        # One ORT call and one dict per stage and pass: for a model of small stages the
        # generic path's extra dicts were ~5 % of a resident pass.
        feeds = self._inputs_from(env)
        with ort_errors(f"stage {self.stage.id} (does plan.json match its file?)"):
            env.update(zip(self._names, self._sess.run(self._names, feeds), strict=True))

    def _release_impl(self) -> None:
        self._sess = None


def fused_stage(stages: Sequence[Stage]) -> Stage:
    """The stage a run of consecutive host stages becomes when it is executed as one session.

    Inputs are what the run reads from outside it; outputs are *every* member's outputs (later
    stages may read any of them).  Sizes add up; ``file`` is the first member's (informative).
    """
    if not stages:
        raise ValueError("fused_stage needs at least one stage")
    produced: set[str] = set()
    inputs: list[str] = []
    outputs: list[str] = []
    for s in stages:
        inputs += [n for n in s.inputs if n not in produced and n not in inputs]
        produced.update(s.outputs)
        outputs += [n for n in s.outputs if n not in outputs]
    first = stages[0]
    blocks = tuple(sorted({b for s in stages for b in (s.blocks or (() if s.block is None else (s.block,)))}))
    return Stage(
        id="+".join(s.id for s in stages), device=first.device, file=first.file, inputs=tuple(inputs),
        outputs=tuple(outputs), block=first.block, region="+".join(s.region for s in stages),
        kind="+".join(s.kind for s in stages), weight_bytes=sum(s.weight_bytes for s in stages),
        io_bytes=sum(s.io_bytes for s in stages), sha256=first.sha256,
        num_nodes=sum(s.num_nodes for s in stages), blocks=blocks,
    )


class FusedOrtRunner(StageRunner):
    """Consecutive host stages run as ONE ORT session (one ``run`` call instead of several).

    ``load`` reads the member files (with their external data) and concatenates their graphs
    in order; ``init`` creates the session from the merged model held in memory.  Member
    stages come from one source model, so a tensor name means the same tensor in all of them
    (initializers with the same name are kept once).
    """

    def __init__(self, stages: Sequence[Stage], folder: Path, threads: int = 0) -> None:
        super().__init__(fused_stage(stages), folder)
        self.members = tuple(stages)
        self._paths = [stage_onnx(folder, s) for s in stages]  # confined, regular, sha256 as recorded
        self._threads = stage_threads(self.stage, threads)
        self._model: bytes | None = None
        self._sess: Any = None
        self._names: list[str] = []

    def _load_impl(self) -> None:
        import onnx

        models = [onnx.load(str(p)) for p in self._paths]
        self._model = _concat_models(models, self.stage).SerializeToString()

    def _init_impl(self) -> None:
        assert self._model is not None
        with ort_errors(f"host stages {self.stage.id}"):
            self._sess = make_session(self._model, threads=self._threads)
        self._names = [o.name for o in self._sess.get_outputs()]
        self._model = None  # the session holds its own copy

    def _infer_impl(self, feeds: Feeds) -> Feeds:
        with ort_errors(f"host stages {self.stage.id} (does plan.json match their files?)"):
            return dict(zip(self._names, self._sess.run(self._names, feeds), strict=True))

    def _release_impl(self) -> None:
        self._sess = None
        self._model = None


def _concat_models(models: Sequence[onnx.ModelProto], fused: Stage) -> onnx.ModelProto:
    """One model whose graph runs ``models`` in order (see :class:`FusedOrtRunner`)."""
    import onnx

    value_infos: dict[str, onnx.ValueInfoProto] = {}
    for m in models:
        for vi in (*m.graph.input, *m.graph.output, *m.graph.value_info):
            value_infos.setdefault(vi.name, vi)
    nodes = [n for m in models for n in m.graph.node]
    inits: dict[str, onnx.TensorProto] = {}
    sparse: dict[str, onnx.SparseTensorProto] = {}
    for m in models:
        for t in m.graph.initializer:
            inits.setdefault(t.name, t)
        for st in m.graph.sparse_initializer:
            sparse.setdefault(st.values.name, st)
    internal = [vi for name, vi in value_infos.items() if name not in fused.inputs and name not in fused.outputs]
    graph = onnx.helper.make_graph(
        nodes, fused.id, [value_infos[n] for n in fused.inputs], [value_infos[n] for n in fused.outputs],
        initializer=list(inits.values()), value_info=internal, sparse_initializer=list(sparse.values()),
    )
    opsets: dict[str, int] = {}
    for m in models:
        for o in m.opset_import:
            opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    merged = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    merged.ir_version = max(m.ir_version for m in models)
    return merged


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

    def fused_runner(self, stages: Sequence[Stage], folder: Path) -> StageRunner | None:
        return FusedOrtRunner(stages, folder, threads=self.threads)

    def describe(self) -> JsonObject:
        import onnxruntime as ort

        d: JsonObject = {"backend": self.name, "runtime": f"onnxruntime {ort.__version__}"}
        if self.threads:
            d["intra_op_threads"] = self.threads
        d["keep_freed_memory"] = keep_freed_memory()
        return d
