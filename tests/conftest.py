"""Shared fixtures (the bundled example, plans of it, PyTorch exports of non-DiT transformers,
real rknn-toolkit2 installations) and the test tiers' rules.

Tiers (markers registered in pyproject.toml): ``toolkit`` builds or runs with a real
rknn-toolkit2, ``export`` exports with torch/diffusers, ``slow`` takes more than a few seconds.
The fast tier is ``pytest -m "not slow and not toolkit and not export"``.  Collection fails when a
test uses a real-toolkit fixture without ``toolkit`` or a torch-export fixture without ``export``;
a test without ``toolkit`` sees an empty toolkits folder and fails when it reads a toolkit
environment of this machine all the same (:func:`_no_toolkit_unless_marked`), so the fast tier
passes on a fresh clone with no toolkit installed.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from rkpart.cli_args import bundled_example
from rkpart.compile import toolkits as toolkit_envs
from rkpart.compile.toolkits import Toolkit
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from tests import toolkits


@pytest.fixture(scope="session")
def example_model() -> Path:
    return bundled_example()


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, tuple[Plan, Path]]:
    """Plans of the bundled example by name: split, split_npu (AdaLN on NPU), fused."""
    root = tmp_path_factory.mktemp("plans")
    out: dict[str, tuple[Plan, Path]] = {}
    for name, strategy, opts in (
        ("split", "split", {}),
        ("split_npu", "split", {"adaln": "npu"}),
        ("fused", "fused", {}),
    ):
        folder = root / name
        out[name] = (partition(example_model, folder, strategy, **opts), folder)
    return out


@pytest.fixture(scope="session")
def vit_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.api.vit import export_vit

    return export_vit(tmp_path_factory.mktemp("vit") / "vit.onnx")


@pytest.fixture(scope="session")
def postnorm_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from tests.api.vit import export_postnorm

    return export_postnorm(tmp_path_factory.mktemp("postnorm") / "postnorm.onnx")


@pytest.fixture(scope="session")
def toolkits_dir() -> Path:
    return toolkits.toolkits_dir()


@pytest.fixture(scope="session")
def tk230() -> Toolkit:
    return toolkits.get_toolkit("2.3.0")


@pytest.fixture(scope="session")
def tk232() -> Toolkit:
    return toolkits.get_toolkit("2.3.2")


@pytest.fixture(scope="session")
def tk250() -> Toolkit:
    return toolkits.get_toolkit("2.5.0")


@pytest.fixture(scope="session")
def real_toolkits() -> dict[str, Toolkit]:
    return {v: toolkits.get_toolkit(v) for v in toolkits.VERSIONS}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # compile learns build memory in the user's cache dir; tests must not read or grow it
    monkeypatch.setenv("RKPART_CACHE_DIR", str(tmp_path_factory.mktemp("rkpart-cache")))
    yield


#: the toolkits folders of this machine as the session found them (``$RKPART_TOOLKITS_DIR`` or the
#: default, and the tests' own ``$RKPART_TEST_TOOLKITS_DIR``): what a test without ``toolkit`` must not read
_REAL_TOOLKIT_ROOTS = frozenset(q for p in (toolkit_envs.toolkits_root(), toolkits.toolkits_dir())
                                for q in (p.absolute(), p.resolve()))


def _real_environment(d: Path, empty: Path) -> Path | None:
    """The installed toolkit environment that reading version folder ``d`` touches (``None``: none).

    ``d`` under a real toolkits folder: itself, when a toolkit is installed there.  ``d`` under
    ``empty`` (where an unmarked test's default toolkits folder points): the real one of the same
    version, so that the test fails naming its cause on a machine that has it, as it fails with
    "not installed" on one that has not.
    """
    parent = Path(d).absolute().parent.resolve()
    for root in _REAL_TOOLKIT_ROOTS:
        if parent in (root.resolve(), empty.resolve()) and (root / d.name / toolkit_envs.MARKER).is_file():
            return root / d.name
    return None


@pytest.fixture(autouse=True)
def _no_toolkit_unless_marked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                              monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test without the ``toolkit`` marker runs as on a machine with no toolkit installed.

    Its default toolkits folder (``$RKPART_TOOLKITS_DIR``, read by commands in this process and in
    the subprocesses it starts) is an empty one, and resolving a toolkit of this machine, by
    version or by its python, fails the test: a hidden dependency on an installed toolkit shows on
    every machine, not only on a fresh clone.
    """
    if request.node.get_closest_marker("toolkit") is not None:
        yield
        return
    empty = tmp_path_factory.getbasetemp() / "no-toolkits"  # never created: no toolkit is installed there
    monkeypatch.setenv("RKPART_TOOLKITS_DIR", str(empty))
    read_marker, detect_version = toolkit_envs._read_marker, toolkit_envs.detect_version

    def refuse(env: Path) -> None:
        pytest.fail(f"{request.node.nodeid} uses the rknn-toolkit2 environment {env} but is not marked "
                    "@pytest.mark.toolkit (the fast tier must pass with no toolkit installed)", pytrace=False)

    def guarded_read_marker(d: Path) -> Toolkit | None:
        env = _real_environment(d, empty)
        if env is not None:
            refuse(env)
        return read_marker(d)

    def guarded_detect_version(python: Path) -> str:
        py = Path(python).absolute()
        env = next((root / py.relative_to(root).parts[0] for root in _REAL_TOOLKIT_ROOTS
                    if py.is_relative_to(root) and len(py.relative_to(root).parts) > 1), None)
        if env is not None:
            refuse(env)
        return detect_version(python)

    monkeypatch.setattr(toolkit_envs, "_read_marker", guarded_read_marker)
    monkeypatch.setattr(toolkit_envs, "detect_version", guarded_detect_version)
    yield


#: modules whose tests share no costly fixture and together run for minutes: under
#: ``pytest -n N --dist loadscope`` (scripts/test.sh) their tests are spread over the workers one by
#: one.  Every other module runs whole on one worker, so its module- and session-scoped fixtures are
#: built once.
_SPREAD = frozenset({"tests/compile/test_npu_families.py", "tests/compile/test_repartition.py",
                     "tests/docs/test_docs_run.py", "tests/targets/test_known_issue_reproducers.py",
                     "tests/partitioner/test_family_sweep.py"})


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on the controller
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope`` by module, except :data:`_SPREAD`'s tests, which are scopes of their own.

    (Not ``--dist loadgroup`` with markers: it renames node ids, which pytest 9.2 no longer allows.)
    """
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return nodeid if module in _SPREAD else module

    return ModuleScheduling(config, log)  # type: ignore[arg-type]


#: fixtures that need a marker: a test using one is in that tier whether it says so or not
_TIER_FIXTURES = {"toolkit": toolkits.FIXTURES,
                  "export": frozenset({"vit_onnx", "postnorm_onnx", "anima_exports", "families"})}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:
        for marker, fixtures in _TIER_FIXTURES.items():
            used = fixtures & set(getattr(item, "fixturenames", ()))
            if used and item.get_closest_marker(marker) is None:
                unmarked.append(f"{item.nodeid} uses {', '.join(sorted(used))} but is not marked @pytest.mark.{marker}")
    if unmarked:
        raise pytest.UsageError("tests outside their tier:\n  " + "\n  ".join(unmarked))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    toolkits.CURRENT["item"] = item  # get_toolkit fails a test that is not marked toolkit
    try:
        return (yield)
    finally:
        toolkits.CURRENT.pop("item", None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if toolkits.INSTALL_TIMES:
        parts = ", ".join(f"{v}: {t:.0f} s" for v, t in sorted(toolkits.INSTALL_TIMES.items()))
        terminalreporter.write_line(f"rknn-toolkit2 installation (0 s = already installed): {parts}")
