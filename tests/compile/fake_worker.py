"""FAKE toolkit worker for fault injection: same command line and result file as worker_main.

A real out-of-memory kill, a hang or a segfault cannot be produced on demand safely, so this
stand-in does what the request's ``config`` asks:
``fake_log`` (lines to print first, e.g. recorded optimiser steps), ``fake_alloc_mb`` (touch
that much memory), ``fake_sleep`` (seconds), ``fake_child`` (spawn a sleeping child and write
its pid to this file), ``fake_signal`` (kill itself with SIGSEGV/SIGKILL/...),
``fake_memoryerror`` (raise MemoryError), ``fake_fail`` (report a toolkit error; a string is its text),
``fake_crash_stage`` (SIGSEGV only for the stage file ``<name>.onnx``), ``fake_crash_node``
(SIGSEGV when a node's name contains this text: a rewrite the "toolkit" crashes on),
``fake_burn`` (seconds of CPU every build spends, as a real build's fixed cost does),
``fake_spin`` (the stand-in for an optimiser that never returns: ``{"stage": name, "node": text,
"rule": rule}``: for the stage file ``<name>.onnx``, or a graph with a node whose name contains
``text``, print ``rule`` rewriting the graph, as the toolkit's optimiser does, and then spin on the
CPU until killed, unless ``disable_rules`` turns ``rule`` off; with no ``rule``, nothing stops it).
Otherwise it "builds" by copying the ONNX bytes to the output.
"""

import json
import os
import signal
import subprocess
import sys
import time


def _spins(path: str, spin: dict) -> bool:
    if spin.get("stage") and os.path.basename(path) == spin["stage"] + ".onnx":
        return True
    if spin.get("node"):
        # a node's name as the file holds it, NodeProto field 3 (tag 0x1a, length, bytes; names under 128
        # bytes): not a tensor named after it, and no onnx import (a fake build's CPU time stays small)
        name = spin["node"].encode()
        with open(path, "rb") as f:
            return b"\x1a" + bytes([len(name)]) + name in f.read()
    return False


def main() -> int:
    with open(sys.argv[2]) as f:
        req = json.load(f)
    cfg = req["config"]
    for line in cfg.get("fake_log", []):
        print(line, flush=True)
    if cfg.get("fake_child"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(cfg["fake_child"], "w") as f:
            f.write(str(child.pid))
    held = None
    if cfg.get("fake_alloc_mb"):
        held = bytearray(int(cfg["fake_alloc_mb"]) * 2**20)
        for i in range(0, len(held), 4096):  # touch every page so it counts as resident
            held[i] = 1
    time.sleep(float(cfg.get("fake_sleep", 0)))
    burn_until = time.process_time() + float(cfg.get("fake_burn", 0))
    while time.process_time() < burn_until:
        pass
    spin = cfg.get("fake_spin")
    if spin and _spins(req["onnx"], spin) and spin.get("rule") not in (cfg.get("disable_rules") or []):
        print("D fuse_ops ...", flush=True)
        if spin.get("rule"):
            print(f"D     {spin['rule']}: remove node = ['fake'], add node = ['fake_2']", flush=True)
        while True:  # until the runner kills the process group
            pass
    crash_stage = cfg.get("fake_crash_stage")
    if crash_stage and os.path.basename(req["onnx"]) == crash_stage + ".onnx":
        os.kill(os.getpid(), signal.SIGSEGV)
    if cfg.get("fake_crash_node"):
        import onnx

        graph = onnx.load(req["onnx"], load_external_data=False).graph
        if any(cfg["fake_crash_node"] in n.name for n in graph.node):
            os.kill(os.getpid(), signal.SIGSEGV)
    if cfg.get("fake_signal"):
        os.kill(os.getpid(), getattr(signal, cfg["fake_signal"]))
    if cfg.get("fake_memoryerror"):
        print("Traceback (most recent call last):\nMemoryError", flush=True)
        result = {"ok": False, "error": "MemoryError", "step": "build"}
        code = 4
    elif cfg.get("fake_fail"):
        error = cfg["fake_fail"] if isinstance(cfg["fake_fail"], str) else "build returned -1"
        result = {"ok": False, "error": error, "step": "build"}
        code = 3
    else:
        with open(req["onnx"], "rb") as src, open(req["output"], "wb") as dst:
            dst.write(src.read())
        result = {"ok": True, "step": "done"}
        code = 0
    del held
    with open(req["result"], "w") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
