"""Small models and helpers shared by the hostile-input tests.

Every model here is built with ``onnx.helper`` (or rkpart's own Anima builder at a very
small size) so the tests need no downloads and each case runs in well under a second.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from onnx import TensorProto, helper, numpy_helper

from rkpart.cli import main
from rkpart.errors import DiscoveryError, InvalidModelError, OutputExistsError, SpecError, UserError
from tests.models.anima import AnimaConfig, build_anima_onnx

#: the documented user-error exit codes (docs/errors.md); anything else from a CLI run on a
#: hostile input is a bug
USER_EXIT_CODES = frozenset({
    UserError.exit_code, InvalidModelError.exit_code, DiscoveryError.exit_code, SpecError.exit_code,
    OutputExistsError.exit_code,
})

#: the smallest Anima-shaped DiT the builder accepts: 1 block, 16 image tokens (~100 kB)
MINI = AnimaConfig.tiny(num_blocks=1, hidden=24, heads=2, ffn_dim=48, context_dim=8, context_len=4,
                        latent_height=4, latent_width=4, adaln_lora_dim=4)


def mini_dit(path: Path, *, external_data: bool = False) -> Path:
    """Write the mini DiT to ``path`` (byte-identical every time)."""
    return build_anima_onnx(MINI, path, external_data=external_data)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def mlp(opset: int = 17) -> onnx.ModelProto:
    """A valid two-layer MLP: loads fine but has no transformer blocks."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[w1, w2],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")


def graph_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[TensorProto] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    """Assemble a model without running the checker (the point is to build invalid ones)."""
    g = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")


def fvi(name: str, shape: Sequence[int | str], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


# -- CLI + filesystem assertions -------------------------------------------------------------


def fast_sample(cases: Sequence[object], every: int) -> list[object]:
    """``cases`` with every ``every``-th one (the first included) in the fast tier and the rest marked slow: a
    matrix whose cases each take a few tenths of a second keeps a sample in the fast tier, all of it in CI."""
    return [c if i % every == 0 else pytest.param(c, marks=pytest.mark.slow) for i, c in enumerate(cases)]


def cli(args: Sequence[object]) -> Result:
    """Run ``rkpart ARGS`` in-process; exceptions are captured, not raised."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def assert_user_error(result: Result, code: int, *needles: str) -> str:
    """``result`` is a clean user error: exit ``code``, one stderr line naming the problem.

    Returns the message line.
    """
    assert isinstance(result.exception, SystemExit) or result.exception is None, (
        f"uncontrolled {type(result.exception).__name__}: {result.exception!r}\n{result.output}"
    )
    assert result.exit_code == code, f"exit {result.exit_code}, wanted {code}: {result.stderr!r}"
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1, f"expected one error line, got {lines!r}"
    msg = lines[0]
    for n in needles:
        assert n.lower() in msg.lower(), f"{n!r} not in {msg!r}"
    return msg


def snapshot(folder: Path) -> dict[str, str] | None:
    """Every file under ``folder`` (hidden ones included) -> sha256; ``None`` if absent."""
    if not folder.exists():
        return None
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
        for p in sorted(folder.rglob("*"))
    }


def siblings(folder: Path) -> list[str]:
    """Names next to ``folder`` that a run may have left behind (staging, old, temp files)."""
    parent = folder.parent
    if not parent.exists():
        return []
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{folder.name}"))


#: fuzz bookkeeping, printed by tests/hostile/conftest.py at the end of the session:
#: ``cases:<test>`` -> cases run, ``exit:<code>`` -> how often each exit code was seen
FUZZ_STATS: Counter[str] = Counter()


#: a custom spec that keeps every op of the example on the host: a bundle without any .rknn
HOST_SPEC = "version: 1\nrest: host\nstages:\n  - id: b00\n    device: host\n    blocks: [0]\n"


def assert_option_refused(args: list[str], out: Path) -> None:
    """``rkpart ARGS`` refuses an option value before any work: click's exit 2 with its one
    "Invalid value" error, no traceback, within seconds, and nothing written in ``out``."""
    import time

    t0 = time.monotonic()
    r = cli(args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "Invalid value" in r.stderr
    assert time.monotonic() - t0 < 30
    assert sorted(p.name for p in out.iterdir()) == []  # nothing written


def kill_at_last_removal(monkeypatch: pytest.MonkeyPatch, module: object, n: int,
                         kill: type[BaseException] = KeyboardInterrupt) -> list[str]:
    """FAULT INJECTION: ``module``'s ``shutil.rmtree`` and every ``Path.unlink`` remove as usual,
    until the ``n``-th removal, where ``kill`` is raised instead (a SIGKILL half-way through
    emptying a folder of ``n`` entries).  Returns the names removed, in order."""
    import shutil

    removed: list[str] = []
    rmtree, unlink = shutil.rmtree, Path.unlink

    def removing(p: Path, real: object) -> None:
        if len(removed) == n - 1:
            raise kill
        removed.append(p.name)
        real(p)  # type: ignore[operator]

    monkeypatch.setattr(module.shutil, "rmtree", lambda p, *a, **k: removing(Path(p), rmtree))  # type: ignore[attr-defined]
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: removing(self, unlink))
    return removed
