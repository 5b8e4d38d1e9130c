"""Throwaway plugin packages, installed into a private site folder for one test session.

Each package is written as a real source tree (``pyproject.toml`` with entry points + a
module), then installed the way pip lays out an installed wheel: the module plus a
``<name>-<version>.dist-info`` folder with ``METADATA`` and ``entry_points.txt``, generated
from the ``pyproject.toml``.  (``pip install --no-build-isolation`` cannot build here: the
venv's setuptools needs the ``wheel`` package.)  The site folder is put on ``PYTHONPATH``
for subprocesses and on ``sys.path`` for in-process tests, so the shared project venv is
never touched and other test sessions never see these plugins.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rkpart.plugins import load_plugins

DEMO_MODULE = '''
"""A third-party strategy and recogniser, as a plugin author would write them."""
from rkpart import Discovery, GroupBuilder, ModelGraph, Partition, Strategy
from rkpart.recognizers import relabel, structural  # the documented path (docs/plugins.md), kept for plugins


class HalvesStrategy(Strategy):
    name = "halves"
    summary = "two NPU stages: the first and second half of the ops in model order"
    needs_blocks = False

    def propose(self, mg: ModelGraph, disc: Discovery | None, **options) -> Partition:
        order = sorted(mg.ops.nodes)
        mid = len(order) // 2
        gb = GroupBuilder()
        gb.add("front", set(order[:mid]), device="npu", region="half", kind="half")
        gb.add("back", set(order[mid:]), device="npu", region="half", kind="half")
        return gb.build(self.name, {})


class VitNames:
    """Names the regions of ViT-style models (input "pixel_values") the way timm does."""

    name = "vit_names"
    summary = "ViT regions named attn / mlp"
    stage = "before"

    def recognize(self, mg: ModelGraph) -> Discovery | None:
        if "pixel_values" not in mg.inputs:
            return None
        return relabel(structural(mg), {"ffn": "mlp"}, method="recognizer:vit_names")


recognizer = VitNames()
'''

BROKEN_MODULE = '''
raise RuntimeError("this plugin is broken on purpose")
'''

# a second package: a duplicate name and a name a built-in already has
DUP_MODULE = '''
from rkpart.grouping.strategies.split import SplitStrategy


class AnotherHalves(SplitStrategy):
    name = "halves"


class MySplit(SplitStrategy):
    name = "split"
'''

EntryPoints = dict[str, dict[str, str]]

PACKAGES: dict[str, tuple[str, str, EntryPoints]] = {
    "rkpart-demo-plugin": ("rkpart_demo_plugin", DEMO_MODULE, {
        "rkpart.strategies": {"halves": "rkpart_demo_plugin:HalvesStrategy"},
        "rkpart.recognizers": {"vit_names": "rkpart_demo_plugin:recognizer"},
    }),
    "rkpart-broken-plugin": ("rkpart_broken_plugin", BROKEN_MODULE, {
        "rkpart.strategies": {"kaputt": "rkpart_broken_plugin:Strategy"},
        "rkpart.recognizers": {"kaputt": "rkpart_broken_plugin:recognizer"},
    }),
    "rkpart-zz-dup-plugin": ("rkpart_zz_dup_plugin", DUP_MODULE, {
        "rkpart.strategies": {"halves": "rkpart_zz_dup_plugin:AnotherHalves",
                              "split": "rkpart_zz_dup_plugin:MySplit"},
    }),
}


def write_package(root: Path, dist: str, module: str, source: str, entry_points: EntryPoints) -> Path:
    """A plugin source tree, as its author would publish it: pyproject.toml + one module."""
    pkg = root / dist
    pkg.mkdir(parents=True)
    (pkg / f"{module}.py").write_text(textwrap.dedent(source))
    eps = "".join(
        f'\n[project.entry-points."{group}"]\n' + "".join(f'{k} = "{v}"\n' for k, v in items.items())
        for group, items in entry_points.items()
    )
    (pkg / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "0.1.0"
        dependencies = ["rkpart"]

        [tool.setuptools]
        py-modules = ["{module}"]
        """) + eps)
    return pkg


def install(pkg: Path, site: Path, dist: str, module: str, entry_points: EntryPoints, version: str = "0.1.0") -> None:
    """Lay ``pkg`` out in ``site`` as pip lays out an installed wheel (module + .dist-info)."""
    shutil.copy2(pkg / f"{module}.py", site / f"{module}.py")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
        for group, items in entry_points.items()))
    (info / "INSTALLER").write_text("rkpart-tests\n")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("plugin-src")
    site = tmp_path_factory.mktemp("plugin-site")
    for dist, (module, source, eps) in PACKAGES.items():
        install(write_package(src, dist, module, source, eps), site, dist, module, eps)
    return site


@pytest.fixture
def plugin_env(plugin_site: Path) -> dict[str, str]:
    """Environment for subprocesses that see the plugins (entry points are scanned afresh)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_site), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture
def plugins_on_path(plugin_site: Path) -> Iterator[Path]:
    """The plugins visible in this process; the load_plugins cache is cleared on both sides."""
    sys.path.insert(0, str(plugin_site))
    load_plugins.cache_clear()
    try:
        yield plugin_site
    finally:
        sys.path.remove(str(plugin_site))
        for mod in [m for m in sys.modules if m.startswith(("rkpart_demo_plugin", "rkpart_zz_dup_plugin"))]:
            del sys.modules[mod]
        load_plugins.cache_clear()
