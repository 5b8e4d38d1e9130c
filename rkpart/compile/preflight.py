"""Checks of a compile's settings made once, before any build starts (issue 13).

A misspelt ``--target`` or ``--config`` key used to surface inside every stage's build, after
minutes, as a multi-line toolkit traceback.  Here the target is checked against
:mod:`rkpart.targets` and the config keys against what the toolkit's ``RKNN.config`` accepts
(asked once per toolkit, in its own python).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from rkpart.compile.cache import CONFIG_DEFAULTS
from rkpart.compile.runner import WORKER, worker_env
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import ToolkitError, UserError
from rkpart.targets import get_target
from rkpart.types import JsonMap

CHECK_TIMEOUT_S = 300.0


def check_target(target: str) -> None:
    """``target`` is a target rkpart knows (:data:`rkpart.targets.TARGETS`); :class:`UserError` if not."""
    get_target(target)


def config_keys(tk: Toolkit, worker: Path = WORKER) -> list[str]:
    """The options ``RKNN.config`` of ``tk`` accepts."""
    with tempfile.TemporaryDirectory(prefix="rkpart-keys-") as d:
        home, tmp = Path(d) / "home", Path(d) / "tmp"
        home.mkdir()
        tmp.mkdir()
        try:
            r = subprocess.run([str(tk.python), str(worker), "config-keys"], capture_output=True, text=True,
                               cwd=d, env=worker_env(home, tmp), timeout=CHECK_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolkitError(f"rknn-toolkit2 {tk.version} did not answer which config options it accepts: "
                               f"{e}") from None
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"config_keys"')]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"rknn-toolkit2 {tk.version} did not answer which config options it accepts "
                           f"(exit {r.returncode}): {tail}")
    return [str(k) for k in json.loads(lines[-1])["config_keys"]]


def check_config(config: JsonMap, toolkits: list[Toolkit], worker: Path = WORKER) -> None:
    """Every key of ``config`` is accepted by ``RKNN.config`` of every toolkit that will build.

    Keys rkpart itself knows (:data:`CONFIG_DEFAULTS`, ``target_platform``) need no toolkit
    round trip; a worker other than rkpart's (a test fake) has no ``RKNN.config`` to ask.
    """
    extra = sorted(set(config) - set(CONFIG_DEFAULTS) - {"target_platform"})
    if not extra or worker != WORKER:
        return
    for tk in toolkits:
        known = config_keys(tk, worker)
        bad = [k for k in extra if k not in known]
        if bad:
            raise UserError(f"config option {bad[0]!r} is not accepted by RKNN.config of rknn-toolkit2 "
                            f"{tk.version} (valid: {', '.join(known)})")
