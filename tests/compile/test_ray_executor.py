"""``rkpart compile --executor ray`` on a REAL three-node Ray cluster on this machine (issue 15).

The cluster is ``ray.cluster_utils.Cluster``: a head node with no CPUs (so builds never run
there) and two worker nodes with one CPU each, on loopback, with small object stores.  Builds
are real rknn-toolkit2 2.5.0 builds of the tiny compile plan.  Nothing is mocked: the killed
node is a real node removed (its raylet and workers SIGKILLed) while it runs a build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from tests.compile.plans import tiny_plan
from tests.toolkits import toolkits_dir

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

if importlib.util.find_spec("ray") is None:  # the ray extra; found, not imported, at collection
    pytest.skip("ray is not installed (pip install rkpart[ray])", allow_module_level=True)
STORE = 100 * 2**20  # bytes of object store per node: stages and artifacts of the tiny plan are KBs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    old = os.environ.get("RKPART_CACHE_DIR")
    os.environ["RKPART_CACHE_DIR"] = str(tmp_path_factory.mktemp("ray-node-cache"))  # the nodes inherit it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE,
                                                      "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=STORE)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("RKPART_CACHE_DIR", None)
        else:
            os.environ["RKPART_CACHE_DIR"] = old


def _entries(folder: Path) -> list[dict[str, Any]]:
    """plan.json stages without what a rebuild legitimately changes (the artifact's sha256)."""
    plan = json.loads((folder / "plan.json").read_text())
    for s in plan["stages"]:
        for a in s["artifacts"]:
            a.pop("sha256")
    return plan["stages"]


def _compile(folder: Path, tk: Toolkit, **kw: Any) -> Any:
    kw.setdefault("cache", False)  # these tests are about builds: the user-level build cache would serve the second
    return compile_plan_report(tiny_plan(folder), folder, CompileOptions(tk, "rk3588", {}, toolkits_dir=toolkits_dir(),
                                                                         **kw))


def test_ray_build_equals_local_build(tmp_path: Path, tk250: Toolkit, cluster: Any) -> None:
    local = _compile(tmp_path / "local", tk250)
    remote = _compile(tmp_path / "ray", tk250, executor="ray", address=cluster.address)
    assert [o.status for o in remote.outcomes] == ["built"] * 3
    assert _entries(tmp_path / "ray") == _entries(tmp_path / "local")
    for o in remote.outcomes:  # the artifact is in the plan folder, where a local build puts it
        assert (tmp_path / "ray" / o.artifact.file).stat().st_size == o.artifact.size_bytes > 0
        assert (tmp_path / "ray" / o.log).read_text() != ""
    assert [o.status for o in local.outcomes] == ["built"] * 3


def _node_of(pid: int, nodes: list[Any]) -> Any | None:
    """The cluster node whose raylet is an ancestor of ``pid``."""
    raylets = {n.all_processes["raylet"][0].process.pid: n for n in nodes}
    try:
        for p in psutil.Process(pid).parents():
            if p.pid in raylets:
                return raylets[p.pid]
    except psutil.Error:
        return None
    return None


def _is_build(p: psutil.Process, cmd: str) -> bool:
    """A build worker: started as ``worker_main.py build``, or forked by a zygote (rkpart.compile.zygote),
    whose command line is its zygote's."""
    if " build " in f"{cmd} ":
        return True
    try:
        return " zygote " in cmd and " ".join(psutil.Process(p.info["ppid"]).cmdline()) == cmd
    except psutil.Error:
        return False


def test_a_node_killed_mid_build_is_retried_elsewhere_and_not_cached_as_a_failure(
        tmp_path: Path, tk250: Toolkit, cluster: Any) -> None:
    folder = tmp_path / "ray"
    box: dict[str, Any] = {}

    def run() -> None:
        box["report"] = _compile(folder, tk250, executor="ray", address=cluster.address)

    t = threading.Thread(target=run)
    t.start()
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and t.is_alive():
        for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "worker_main.py" in cmd and _is_build(p, cmd) and str(folder) not in cmd:
                node = _node_of(p.info["pid"], list(cluster.worker_nodes))
                if node is not None:
                    killed = node
                    cluster.remove_node(node, allow_graceful=False)  # SIGKILL its raylet and workers
                    break
        time.sleep(0.1)
    t.join(timeout=600)
    assert killed is not None, "no build was seen running on a worker node"
    assert not t.is_alive()
    rep = box["report"]
    assert [o.status for o in rep.outcomes] == ["built"] * 3, [o.failures for o in rep.outcomes]
    assert not list((folder / "rknn" / "objects").glob("*.fail.json"))  # nothing cached as a stage failure
    # the build that was lost finished on the other worker; the GCS marks the killed node dead
    # after its heartbeat times out, which can come after the builds finished
    import ray

    deadline = time.monotonic() + 60
    while True:
        alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
        if len(alive) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(alive) == 1
    local = _compile(tmp_path / "local", tk250)
    assert [o.status for o in local.outcomes] == ["built"] * 3
    assert _entries(folder) == _entries(tmp_path / "local")
