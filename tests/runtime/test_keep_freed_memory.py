"""Keeping freed memory (rkpart.runtime.malloc): a per-stage load-run-release cycle reuses its pages.

Each setting runs in its own process (``mallopt`` is process-wide); the outcome is counted in
minor page faults of fresh sessions' first calls, not timed.  Real ONNX Runtime sessions.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# outside the fast tier: fresh processes measuring page faults (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: T x H float32 intermediates, three live at once (72 MiB with H = 3072, T = 1024): ORT's arena
#: needs regions of 32 MiB and more, which glibc maps and unmaps whatever its thresholds
CHILD = textwrap.dedent("""
    import json, resource, statistics
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from rkpart.runtime.malloc import in_effect
    from rkpart.runtime.ort import OrtBackend, make_session

    T, D, H = 1024, 256, 3072
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((D, H)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((H, D)).astype(np.float32), "w2")
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w1"], ["h"]), mk("Sigmoid", ["h"], ["r"]), mk("Tanh", ["h"], ["s"]),
             mk("Mul", ["r", "s"], ["t"]), mk("Add", ["t", "h"], ["u"]), mk("MatMul", ["u", "w2"], ["y"])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [T, D])], [vi("y", TensorProto.FLOAT, [T, D])],
                          [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    data = m.SerializeToString()
    feeds = {"x": rng.standard_normal((T, D)).astype(np.float32)}
    ref = None
    faults = []
    for _ in range(12):
        s = make_session(data, threads=1)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = s.run(None, feeds)[0]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        assert ref is None or np.array_equal(y, ref)
        ref = y
        del s
    print(json.dumps({"in_effect": in_effect(), "describe": OrtBackend().describe()["keep_freed_memory"],
                      "late_faults": statistics.median(faults[6:]), "maxrss_kib": resource.getrusage(
                          resource.RUSAGE_SELF).ru_maxrss}))
""")

#: pages of one T x H float32 intermediate
PAGES = 1024 * 3072 * 4 // 4096


def run_child(setting: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "RKPART_KEEP_FREED_MEMORY"}
    if setting is not None:
        env["RKPART_KEEP_FREED_MEMORY"] = setting
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r: dict[str, object] = json.loads(out.stdout)
    return r


glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="mallopt is glibc's")


@glibc
def test_fresh_sessions_reuse_freed_pages_by_default() -> None:
    on = run_child(None)  # the default
    assert on["in_effect"] is True and on["describe"] is True
    # after a few cycles the heap holds the working set: a fresh session's first call faults
    # (almost) nothing in
    assert float(on["late_faults"]) <= PAGES / 4, on  # type: ignore[arg-type]


@glibc
def test_switch_off_leaves_glibc_defaults_and_fresh_sessions_fault_again() -> None:
    off = run_child("0")
    assert off["in_effect"] is False and off["describe"] is False
    # ORT's arena regions are unmapped with the session and faulted in again by the next one
    assert float(off["late_faults"]) >= PAGES, off  # type: ignore[arg-type]


@glibc
def test_kept_memory_is_bounded() -> None:
    on, off = run_child("1"), run_child("0")
    # peak RSS after 12 cycles with kept memory: within one working set (3 x 12 MiB) of the default's
    assert int(on["maxrss_kib"]) <= int(off["maxrss_kib"]) + 3 * PAGES * 4, (on, off)  # type: ignore[call-overload]


def test_switch_values() -> None:
    from rkpart.runtime import malloc

    for v, want in (("0", False), ("off", False), ("False", False), (" no ", False), ("1", True), ("yes", True)):
        os.environ[malloc.ENV] = v
        try:
            assert malloc.wanted() is want, v
        finally:
            del os.environ[malloc.ENV]
    assert malloc.wanted() is True


GIVE_BACK = textwrap.dedent("""
    import json, os
    import numpy as np
    from rkpart.runtime.malloc import give_back, keep_freed_memory

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    keep = keep_freed_memory()
    a = np.ones(24 << 18, dtype=np.float32)  # 24 MiB, below the kept mmap threshold
    held = rss_mib()
    del a
    freed = rss_mib()
    gave = give_back()
    print(json.dumps({"keep": keep, "held": held, "freed": freed, "gave": gave, "after": rss_mib()}))
""")


@glibc
@pytest.mark.parametrize("setting", ["1", "0"])
def test_give_back_returns_kept_memory_for_memory_profiles(setting: str) -> None:
    env = {**os.environ, "RKPART_KEEP_FREED_MEMORY": setting, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", GIVE_BACK], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    if setting == "1":
        assert r["keep"] and r["gave"]
        assert r["freed"] > r["held"] - 4, r  # freed, but kept in the process
        assert r["after"] < r["held"] - 20, r  # given back
    else:
        assert not r["keep"] and not r["gave"]
        assert r["freed"] < r["held"] - 20, r  # glibc's defaults: unmapped on free
