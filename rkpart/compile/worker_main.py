"""The rknn-toolkit2 worker: runs *inside a toolkit's venv*, started by rkpart as a subprocess.

rkpart is not installed in the toolkit's venv, so this file uses only the standard library,
numpy and ``rknn``.  It is run by path: ``<toolkit python> worker_main.py MODE ...``.

Modes
-----
``build REQUEST.json``
    REQUEST = {"onnx": path, "output": path.rknn, "config": {...RKNN.config kwargs},
    "result": path.json, "quantize": optional}.  Loads, builds fp16 (``do_quantization=False``),
    or with ``quantize`` = {"dataset": dataset.txt, "hybrid": bool} int8 (``do_quantization=True``;
    the config carries ``quantized_dtype``/``quantized_algorithm``), and exports atomically;
    writes RESULT = {"ok": bool, "step": ..., "error": ..., "toolkit": version, "float16_layers"}.
    Exit status 0 on success, 3 when a toolkit call returned an error, 4 on MemoryError.
    All toolkit output (including the native "Network Layer Information Table", which the
    toolkit's ``verbose_file`` does not receive) goes to this process's stdout/stderr, which
    the runner sends to the build log.

``zygote FD [FOLDER]``
    A fork server (:mod:`rkpart.compile.zygote`): imports ``rknn.api`` once (torch, onnx, scipy,
    cv2: ~3.5 s of CPU, 5-15 s of wall, which every build and simulator session otherwise pays),
    then serves requests on the ``AF_UNIX`` ``SOCK_SEQPACKET`` socket ``FD``: each message
    ``{"id": n, "argv": [...], "cwd": ..., "env": {...}}`` carries three file descriptors (the
    child's stdin, stdout, stderr).  It forks one child per request, which starts a session of its
    own (a timeout kills its whole group), dies with the zygote (``PR_SET_PDEATHSIG``), takes the
    request's cwd, environment and descriptors and runs ``main(argv)`` as the script would; a
    crash kills only the child.  Replies: ``{"id": n, "pid": p}`` once forked,
    ``{"id": n, "pid": p, "status": code}`` when reaped (``status`` as ``Popen.returncode``:
    negative for a signal).  The zygote never builds anything itself, so every child starts from
    the same just-imported state.  End of the socket (rkpart gone, even by SIGKILL): it kills
    every child's group and exits.

``config-keys``
    Prints ``{"config_keys": [...]}``: the options ``RKNN.config`` accepts (checked once by
    rkpart before any build).

``simulate``
    A persistent session hosting any number of stages, each its own ``RKNN`` object under a
    caller-chosen ``key`` (default ``""``).  Requests are JSON lines on stdin, replies JSON
    lines on the original stdout; toolkit chatter is moved to stderr so it cannot corrupt
    them.  Tensors travel in .npz files (``allow_pickle=False``).  Operations:
    ``{"op": "load", "key": k, "onnx": path, "config": {...}}`` -> a new RKNN + load_onnx
    (replacing any model under ``k``);
    ``{"op": "init", "key": k, "quantize": optional}`` -> build + init_runtime() (the simulator:
    a loaded .rknn cannot run there, so every model is built from ONNX; ``quantize`` as for
    ``build``, so an int8 stage is simulated as it was compiled);
    ``{"op": "infer", "key": k, "inputs": in.npz, "names": [...], "outputs": out.npz,
    "output_names": [...]}`` -> inference;
    ``{"op": "drop", "key": k}`` -> release that model and hand its memory back to the system
    (``malloc_trim``: without it the process keeps nearly all of it), keep serving;
    ``{"op": "release"}`` -> release every model and exit.
    Replies: ``{"ok": true, "rss": bytes, ...}`` or ``{"ok": false, "error": "...", "rss": bytes}``;
    ``rss`` is this process's resident set after the operation (what the caller's memory
    bound is learned from).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rkpart.types import JsonObject

EXIT_TOOLKIT_ERROR = 3
EXIT_MEMORY = 4
EXIT_DISK = 5  # no space left on device (or quota): the machine, not the graph
_DISK_ERRNOS = (28, 122)  # ENOSPC, EDQUOT


def _toolkit_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("rknn-toolkit2")
    except Exception:  # noqa: BLE001 - a broken install metadata must not fail the build; the version is informative
        return "unknown"


class StepError(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


def _check(step: str, ret: Any) -> None:
    # Toolkit calls return 0 on success and -1 (or another non-zero) after logging an error.
    if ret != 0:
        raise StepError(step, f"{step} returned {ret}")


def _config_kwargs(rknn: Any, config: JsonObject) -> JsonObject:
    # RKNN.config takes **kwargs and silently ignores misspelt options; refuse them instead.
    params = inspect.signature(rknn.config).parameters
    known = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        # read from **kwargs: the option the toolkit's own errors name ("You can add
        # disable_rules=['fuse_...'] in rknn.config()"), which rkpart compile retries with
        known.add("disable_rules")
    unknown = sorted(set(config) - known)
    if unknown:
        raise StepError("config", f"config option {unknown[0]!r} is not accepted by RKNN.config "
                                  f"(valid: {', '.join(sorted(known))})")
    return dict(config)


def _make_rknn(config: JsonObject) -> Any:
    from rknn.api import RKNN

    rknn = RKNN(verbose=True)
    _check("config", rknn.config(**_config_kwargs(rknn, config)))
    return rknn


def _vm_hwm() -> int:
    """This process's own high-water resident memory, bytes (``VmHWM``: not ``ru_maxrss``, which
    counts the parent's memory copied by ``fork`` before ``exec``); 0 where /proc has none.

    :func:`rkpart.compile.runner.peak_of` for this process: written again because the worker runs in
    the toolkit's interpreter, which has no rkpart to import."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _write_json(path: str, data: JsonObject) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def build(request_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    result: JsonObject = {"ok": False, "toolkit": _toolkit_version(), "step": "start"}
    code = 0
    rknn = None
    try:
        result["step"] = "config"
        rknn = _make_rknn(req.get("config", {}))
        result["step"] = "load_onnx"
        _check("load_onnx", rknn.load_onnx(model=req["onnx"]))
        result["step"] = "build"
        quantize = req.get("quantize")
        if quantize:
            rknn, kept = _build_quantized(rknn, req, quantize)
            result["float16_layers"] = kept
        else:
            _check("build", rknn.build(do_quantization=False))
        result["step"] = "export_rknn"
        out = req["output"]
        tmp = f"{out}.{os.getpid()}.part"
        _check("export_rknn", rknn.export_rknn(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
        result.update(ok=True, step="done")
    except StepError as e:
        result.update(step=e.step, error=str(e))
        code = EXIT_TOOLKIT_ERROR
    except MemoryError:
        with contextlib.suppress(OSError):  # the log itself may be on a full disk
            traceback.print_exc()
        result.update(error="MemoryError")
        code = EXIT_MEMORY
    except Exception as e:  # noqa: BLE001 - every toolkit error becomes a typed result for rkpart
        with contextlib.suppress(OSError):
            traceback.print_exc()
        result.update(error=f"{type(e).__name__}: {e}")
        code = EXIT_DISK if isinstance(e, OSError) and e.errno in _DISK_ERRNOS else EXIT_TOOLKIT_ERROR
    finally:
        if rknn is not None:
            with contextlib.suppress(Exception):
                rknn.release()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    result["vm_hwm_bytes"] = _vm_hwm()
    try:
        _write_json(req["result"], result)
    except OSError as e:
        if e.errno in _DISK_ERRNOS:
            return EXIT_DISK
        raise
    return code


def _build_quantized(rknn: Any, req: JsonObject, q: JsonObject) -> tuple[Any, list[str]]:
    """int8 (w8a8) build from ``q["dataset"]``; returns the RKNN object that holds the built
    model and the layers kept in float16 (hybrid only; empty for int8)."""
    dataset = q["dataset"]
    if not q.get("hybrid"):
        _check("build", rknn.build(do_quantization=True, dataset=dataset))
        return rknn, []
    return _build_hybrid(rknn, req, q)


def _worst_layers(report: str, cosine: float, most: int) -> list[str]:
    """Layers of ``accuracy_analysis``'s ``error_analysis.txt`` to keep in float16: those whose
    *single*-layer cosine (its own error, not the accumulated one) is below ``cosine``, worst
    first, at most ``most``; at least the worst one (else hybrid would equal int8)."""
    rows = []
    for line in report.splitlines():
        parts = line.split()
        if len(parts) < 8 or not line.startswith("[") or parts[0] in ("[Input]", "[exDataConvert]"):
            continue
        try:
            single = float(parts[5])
        except ValueError:
            continue
        rows.append((single, parts[1]))
    rows.sort()
    kept = [name for cos, name in rows if cos < cosine][:most]
    return kept or [name for _cos, name in rows[:1]]


def _build_hybrid(rknn: Any, req: JsonObject, q: JsonObject) -> tuple[Any, list[str]]:
    """hybrid_quantization_step1 -> mark layers float16 in its .quantization.cfg -> step2.

    The layers are ``q["float16_layers"]`` when given (the simulator repeating a compile's
    choice), else measured: an int8 build's ``accuracy_analysis`` on the dataset's first
    sample (:func:`_worst_layers`)."""
    from rknn.api import RKNN

    dataset = q["dataset"]
    base = os.path.dirname(os.path.abspath(dataset))
    with open(dataset) as f:
        first = [os.path.join(base, t) for t in f.readline().split()]
    work = os.path.abspath(f"hybrid-{os.getpid()}-{len(os.listdir('.'))}")
    os.makedirs(work)
    old = os.getcwd()
    os.chdir(work)  # step1 writes <model>.model/.data/.quantization.cfg into the cwd
    try:
        kept = [str(x) for x in q.get("float16_layers") or []]
        if not kept:
            _check("build", rknn.build(do_quantization=True, dataset=dataset))
            _check("accuracy_analysis", rknn.accuracy_analysis(inputs=first, output_dir="snapshot"))
            with open(os.path.join("snapshot", "error_analysis.txt")) as f:
                kept = _worst_layers(f.read(), float(q.get("hybrid_cosine", 0.999)),
                                     int(q.get("hybrid_max_layers", 8)))
            print(f"rkpart hybrid: keeping in float16: {kept}", flush=True)
        rknn.release()
        rknn = _make_rknn(req.get("config", {}))
        _check("load_onnx", rknn.load_onnx(model=req["onnx"]))
        _check("hybrid_quantization_step1", rknn.hybrid_quantization_step1(dataset=dataset, proposal=False))
        name = os.path.splitext(os.path.basename(req["onnx"]))[0]
        cfg = f"{name}.quantization.cfg"
        with open(cfg) as f:
            text = f.read()
        layers = "".join(f"    {json.dumps(k)}: float16\n" for k in kept)
        head = "custom_quantize_layers: {}\n"
        if not text.startswith(head):
            raise StepError("hybrid_quantization_step1", f"unexpected {cfg}: no empty custom_quantize_layers")
        with open(cfg, "w") as f:
            f.write("custom_quantize_layers:\n" + layers + text[len(head):])
        rknn.release()
        rknn = RKNN(verbose=True)
        _check("hybrid_quantization_step2", rknn.hybrid_quantization_step2(
            model_input=f"{name}.model", data_input=f"{name}.data", model_quantization_cfg=cfg))
        return rknn, kept
    finally:
        os.chdir(old)


def _rss() -> int:
    """This process's resident set in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _trim() -> None:
    """Give freed heap back to the system: a released RKNN object's memory otherwise stays
    in the process (measured: 1120 -> 1103 MiB after release(), 596 MiB after malloc_trim)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def simulate() -> int:
    import numpy as np

    # Keep the protocol channel private: the toolkit (and its native library) print to fd 1.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)

    def reply(**kw: Any) -> None:
        kw["rss"] = _rss()
        proto.write(json.dumps(kw) + "\n")
        proto.flush()

    models: JsonObject = {}
    loads: dict[str, JsonObject] = {}  # key -> its load request (onnx, config): a hybrid build reloads

    def model(req: JsonObject) -> Any:
        key = req.get("key", "")
        if key not in models:
            raise StepError(str(req.get("op")), f"no model loaded under key {key!r}")
        return models[key]

    def drop(key: str) -> None:
        old = models.pop(key, None)
        if old is not None:
            old.release()
            _trim()

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "load":
                key = req.get("key", "")
                drop(key)
                rknn = _make_rknn(req.get("config", {}))
                models[key] = rknn
                loads[key] = req
                _check("load_onnx", rknn.load_onnx(model=req["onnx"]))
                reply(ok=True, toolkit=_toolkit_version())
            elif op == "init":
                rknn = model(req)
                if req.get("quantize"):  # int8 / hybrid: built as compile built it, from the same dataset
                    rknn, _kept = _build_quantized(rknn, loads[req.get("key", "")], req["quantize"])
                    models[req.get("key", "")] = rknn
                else:
                    _check("build", rknn.build(do_quantization=False))
                _check("init_runtime", rknn.init_runtime())
                reply(ok=True)
            elif op == "infer":
                rknn = model(req)
                with np.load(req["inputs"], allow_pickle=False) as z:
                    arrays = [np.ascontiguousarray(z[n]) for n in req["names"]]
                # data_format matters only for 4-D inputs; the toolkit's default there is NHWC,
                # but stage tensors are laid out as in the ONNX graph (NCHW).
                fmts = ["nchw" if a.ndim == 4 else "nhwc" for a in arrays]
                outs = rknn.inference(inputs=arrays, data_format=fmts)
                if outs is None:
                    raise StepError("inference", "inference returned None")
                names = req["output_names"]
                if len(outs) != len(names):
                    raise StepError("inference", f"expected {len(names)} outputs, got {len(outs)}")
                tmp = req["outputs"] + ".part.npz"
                # (no zip(strict=...): the toolkit's python may be older than 3.10)
                arrays_out: JsonObject = {n: np.asarray(o) for n, o in zip(names, outs)}  # noqa: B905
                np.savez(tmp, **arrays_out)
                os.replace(tmp, req["outputs"])
                reply(ok=True)
            elif op == "drop":
                drop(req.get("key", ""))
                reply(ok=True)
            elif op == "release":
                for key in list(models):
                    drop(key)
                reply(ok=True)
                return 0
            else:
                reply(ok=False, error=f"unknown op {op!r}")
        except StepError as e:
            reply(ok=False, error=str(e), step=e.step)
        except Exception as e:  # noqa: BLE001 - every toolkit error becomes a typed reply; the worker keeps serving
            traceback.print_exc()
            reply(ok=False, error=f"{type(e).__name__}: {e}", step=str(op))
    return 0


def config_keys() -> int:
    """Print the keyword arguments ``RKNN.config`` accepts, as one JSON line (last line of stdout)."""
    from rknn.api import RKNN

    params = inspect.signature(RKNN.config).parameters
    known = sorted(n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD)
    sys.stdout.write("\n" + json.dumps({"config_keys": known}) + "\n")
    sys.stdout.flush()
    return 0


def _send(sock: Any, msg: JsonObject) -> None:
    sock.send(json.dumps(msg).encode())


def zygote(fd: int, folder: str = "") -> int:
    """The fork server (see the module docstring, ``zygote FD [FOLDER]``; ``FOLDER``: its own, removed
    when it ends)."""
    import select
    import signal
    import socket

    sock = socket.socket(fileno=fd)
    children: dict[int, int] = {}  # pid -> request id
    try:
        from rknn.api import RKNN  # noqa: F401 - the import every child would pay, paid once here

        sys.stdout.flush()
        sys.stderr.flush()
        _send(sock, {"ready": True, "pid": os.getpid(), "toolkit": _toolkit_version()})
        # asleep until a request or a child's end (SIGCHLD wakes the select): no polling while idle
        woken, wake = os.pipe()
        os.set_blocking(woken, False)
        os.set_blocking(wake, False)
        signal.set_wakeup_fd(wake)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            r, _, _ = select.select([sock.fileno(), woken], [], [], 5.0)
            if woken in r:
                with contextlib.suppress(BlockingIOError):
                    os.read(woken, 4096)
            if sock.fileno() in r:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
                if not data:  # rkpart is gone
                    for f in fds:
                        os.close(f)
                    return 0
                req = json.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                # the pid is handed out once the child is a session leader (its group can be killed)
                settled, settled_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(settled)
                    signal.set_wakeup_fd(-1)
                    os.close(woken)
                    os.close(wake)
                    _zygote_child(sock, fds, req, settled_w)  # never returns
                os.close(settled_w)
                os.read(settled, 1)  # EOF: the child closed it after setsid (or died)
                os.close(settled)
                for f in fds:
                    os.close(f)
                children[pid] = int(req["id"])
                _send(sock, {"id": req["id"], "pid": pid})
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                rid = children.pop(pid, None)
                if rid is not None:
                    _send(sock, {"id": rid, "pid": pid, "status": os.waitstatus_to_exitcode(status)})
    except OSError:  # the socket broke (rkpart died mid-reply): as for its end
        return 0
    finally:  # leave nothing of ours running, and not our folder
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        if folder and os.path.basename(folder).startswith("rkpart-zygote-"):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def _zygote_child(sock: Any, fds: list[int], req: JsonObject, settled: int) -> None:
    """A forked child of the zygote: becomes the worker the request names, then exits."""
    import signal
    import tempfile

    code = 1
    try:
        os.setsid()
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        os.close(settled)
        sock.close()
        for i, f in enumerate(fds):
            os.dup2(f, i)
        for f in fds:
            if f > 2:
                os.close(f)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        tempfile.tempdir = None  # TMPDIR is the request's now
        argv = [str(a) for a in req["argv"]]
        sys.argv = [__file__, *argv]
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever happens, the child ends here, not in the zygote's loop
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "build":
        return build(argv[1])
    if argv and argv[0] == "simulate":
        return simulate()
    if argv and argv[0] == "config-keys":
        return config_keys()
    if len(argv) >= 2 and argv[0] == "zygote":
        return zygote(int(argv[1]), argv[2] if len(argv) > 2 else "")
    print("usage: worker_main.py build REQUEST.json | simulate | config-keys | zygote FD", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
