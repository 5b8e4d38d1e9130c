"""FAKE toolkit worker for fast reduction tests: "crashes" on a chosen graph pattern.

The real toolkit's crash needs seconds per build; the reduction logic (bisect, linear,
cache, time budget) is exercised here against a stand-in with the same command line and
result file as ``worker_main.py build``.  It kills itself with SIGSEGV when the ONNX graph
contains every edge in ``config["fake_crash_edges"]`` (pairs of node names: the second reads
an output of the first), and only when ``$FAKE_TK_VERSION`` (set by the per-version wrapper
"python" of a fake toolkit) is in ``config["fake_crash_versions"]``.  Before crashing it
prints the optimiser lines that the exnorm-fusion signature looks for, like the real 2.3.2.
Otherwise it "builds" by copying the ONNX bytes.
"""

import json
import os
import signal
import sys

import onnx


def _crashes(model: onnx.ModelProto, edges: list) -> bool:
    if not edges:
        return False
    nodes = {n.name: n for n in model.graph.node}
    for a, b in edges:
        if a not in nodes or b not in nodes:
            return False
        if not set(nodes[a].output) & set(nodes[b].input):
            return False
    return True


#: what the fake's "RKNN.config" accepts (answered to ``worker_main.py config-keys``)
CONFIG_KEYS = ["fake_crash_edges", "fake_crash_versions", "optimization_level", "single_core_mode", "target_platform"]


def main() -> int:
    if sys.argv[1:2] == ["config-keys"]:
        print(json.dumps({"config_keys": CONFIG_KEYS}))
        return 0
    with open(sys.argv[2]) as f:
        req = json.load(f)
    cfg = req["config"]
    model = onnx.load(req["onnx"])
    print(f"I fake toolkit {os.environ.get('FAKE_TK_VERSION', '?')}: {len(model.graph.node)} nodes", flush=True)
    version = os.environ.get("FAKE_TK_VERSION", "")
    if version in cfg.get("fake_crash_versions", [version]) and _crashes(model, cfg.get("fake_crash_edges", [])):
        print("D fuse_ops ...", flush=True)
        print("D     fuse_exnorm_mul: remove node = ['fake/Mul']", flush=True)
        print("D fuse_ops done.", flush=True)
        print("I rknn building ...", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    with open(req["onnx"], "rb") as src, open(req["output"], "wb") as dst:
        dst.write(src.read())
    with open(req["result"], "w") as f:
        json.dump({"ok": True, "step": "done"}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
