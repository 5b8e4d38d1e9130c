"""The patch registry's shape, and the export core without the ``export`` extra (no torch needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rkpart.export import EXPORTERS, GENERIC, PATCHES, patches_for
from rkpart.export.patches import describe


def test_every_patch_says_what_it_is_for_in_one_line() -> None:
    for cls, patches in PATCHES.items():
        names = [p.name for p in patches]
        assert len(set(names)) == len(names), cls
        kinds = [p.kind for p in patches]
        assert kinds == sorted(kinds), f"{cls}: adapters run before rewrites"  # "adapter" < "rewrite"
        for p in (*patches, *GENERIC):
            assert p.why and "\n" not in p.why and len(p.why) <= 110, (cls, p.name)
            assert set(p.exporters) <= set(EXPORTERS) and p.exporters, (cls, p.name)


def test_patches_for_filters_by_exporter() -> None:
    ts = [p.name for p in patches_for("Lumina2Transformer2DModel", "torchscript")]
    dy = [p.name for p in patches_for("Lumina2Transformer2DModel", "dynamo")]
    assert ts == ["real_rope", "decompose_rms_norm"]  # the class's own, then the generic TorchScript one
    assert dy == ["real_rope"]
    assert [p.name for p in patches_for("FluxTransformer2DModel", "dynamo")] == []
    with pytest.raises(ValueError, match="unknown exporter 'onnx'; expected one of torchscript, dynamo"):
        patches_for("FluxTransformer2DModel", "onnx")
    assert len(describe()) == sum(len(p) + len(GENERIC) for p in PATCHES.values())


#: run in a fresh interpreter where torch, diffusers and onnxscript cannot be imported (as if the extra
#: were not installed): rkpart.export imports, the export stops with the one-line install hint, nothing
#: is written, and the CLI's other commands still run
_HIDDEN = """
import sys
for name in ("torch", "diffusers", "onnxscript"):
    sys.modules[name] = None
import rkpart.export
from rkpart.errors import UserError
from rkpart.export import export_module, require_extra
try:
    export_module(object(), {}, sys.argv[1])
except UserError as e:
    print(f"{type(e).__name__} {e.exit_code}: {e}")
try:
    require_extra()
except UserError as e:
    print(f"{type(e).__name__} {e.exit_code}: {e}")
assert not any(m in sys.modules and sys.modules[m] is not None for m in ("torch", "diffusers", "onnxscript"))
from rkpart.cli import main
main(["partition", "--help"], standalone_mode=False)
"""


@pytest.mark.slow
def test_without_the_extra_the_export_says_how_to_install_it(tmp_path: Path) -> None:
    out = tmp_path / "transformer.onnx"
    r = subprocess.run([sys.executable, "-c", _HIDDEN, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == [
        "UserError 2: torch is not installed (exporting needs the export extra): pip install 'rkpart[export]'",
        "UserError 2: torch, onnxscript, diffusers are not installed (exporting needs the export extra): "
        "pip install 'rkpart[export]'",
        *lines[2:],
    ]
    assert "Usage: " in r.stdout  # another command's help still works
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_cache_key_holds_the_source_of_every_module_an_export_runs() -> None:
    """tests' cached_export keys on source_key: a change to a patch, the registry or the export code
    invalidates exactly the exports that run it."""
    from rkpart.export import source_key

    lumina = "\n".join(source_key("Lumina2Transformer2DModel", "dynamo"))
    flux_ts = "\n".join(source_key("FluxTransformer2DModel", "torchscript"))
    flux_dy = "\n".join(source_key("FluxTransformer2DModel", "dynamo"))
    for key in (lumina, flux_ts, flux_dy):
        assert "def export_module(" in key and "PATCHES: dict[str, tuple[Patch, ...]] = {" in key
    assert "def real_rope_lumina2(" in lumina and "def real_rope_lumina2(" not in flux_ts
    assert "def decompose_rms_norm(" in flux_ts and "def decompose_rms_norm(" not in flux_dy
