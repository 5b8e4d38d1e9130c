"""A build that runs far past its peers is a hang: stopped early and said at once, not waited out.

A toolkit can loop in its optimiser: 2.5.0 never returns once ``replace_rms_norm`` took an unrelated
``Mul`` for a norm's weight (RFD4), nor on a rank-6 RoPE after ``rope-pair-matrix``; issue 50 measured a
default compile that built 22 stages in about a minute or less each and then sat over 9 minutes of CPU
in the optimiser on one 115 KB attention stage, waiting for the default ``--timeout`` (900 s + 2 s per MiB).

Here every build of a compile is watched against its **peers**, the builds of the same toolkit that
finished in this compile (or whose cache entries recorded their CPU time).  A peer's CPU time is split
into a fixed part (the toolkit's import and load: the fastest peer's time) and a part that grows with
the stage; the variable part is scaled by how much larger the stage is (its node count and its bytes,
whichever ratio is larger; never below 1) and the largest prediction of all peers is the one taken, so
an unusual peer makes the budget looser, never tighter.  A build whose process tree has used more than
:data:`HANG_FACTOR` times that prediction, and at least :data:`HANG_FLOOR_S` seconds of CPU, is
stopped: a ``timeout`` failure whose message says it was stopped as a hang, retried with the workaround
its log names (:func:`hang_rules`) and, by ``rkpart compile``, reduced as ``--repartition`` reduces a
hang.  CPU time, not wall time: on a machine shared with other builds a stage's wall time stretches,
its CPU time does not.  The budget is asked again at every sample, so a peer that finishes while a
build runs tightens it.  A build with no peer yet runs to ``--timeout``; past the floor the user is told
that it is still building and why it is not judged yet.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rkpart.progress import Progress
from rkpart.units import human_bytes

#: a build is a hang past this many times the CPU time its peers predict for it
HANG_FACTOR = 5.0
#: ... and never before this many seconds of CPU (a budget from small first stages kills nothing)
HANG_FLOOR_S = 120.0

#: what a running build is asked with at every sample: (CPU seconds of its process tree, wall seconds)
#: -> why it is stopped now, or ``None`` to let it run
Watch = Callable[[float, float], "str | None"]


@dataclass(frozen=True)
class Peer:
    """A finished build of one stage: its CPU time and its size."""

    stage: str
    cpu_s: float
    nodes: int
    size_bytes: int


def predict(peers: list[Peer], nodes: int, size_bytes: int) -> float | None:
    """CPU seconds the ``peers`` predict for a build of a stage of ``nodes`` nodes and ``size_bytes``
    bytes (see the module's docstring), or ``None`` with no peer."""
    peers = [p for p in peers if p.cpu_s > 0]
    if not peers:
        return None
    base = min(p.cpu_s for p in peers)
    return max(base + (p.cpu_s - base) * max(1.0, nodes / max(1, p.nodes), size_bytes / max(1, p.size_bytes))
               for p in peers)


@dataclass(frozen=True)
class Budget:
    """The CPU seconds a build may use before it counts as a hang, and where the figure comes from."""

    cpu_s: float
    why: str


def budget(peers: list[Peer], nodes: int, size_bytes: int, factor: float = HANG_FACTOR,
           floor: float = HANG_FLOOR_S) -> Budget | None:
    """The hang budget of a stage from its ``peers`` (``None``: no peer, only ``--timeout`` applies)."""
    pred = predict(peers, nodes, size_bytes)
    if pred is None:
        return None
    limit = max(floor, factor * pred)
    why = (f"{factor:g} x the {pred:.1f} s of CPU that {len(peers)} finished build(s) predict for its "
           f"{nodes} nodes / {human_bytes(size_bytes)}" + (f", at least {floor:g} s" if limit == floor else ""))
    return Budget(limit, why)


@dataclass(frozen=True)
class HangStop:
    """A build that did not return: stopped as a hang, or killed at ``--timeout`` (``compile --json``'s
    ``hangs``; ``budget_s`` is then the timeout, in wall seconds)."""

    stage: str
    toolkit: str
    cpu_s: float
    wall_s: float
    budget_s: float
    why: str
    #: how the stage was built after the stop (a workaround), or ``None`` when it was not
    resolved_by: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"stage": self.stage, "toolkit": self.toolkit, "cpu_s": round(self.cpu_s, 1),
                "wall_s": round(self.wall_s, 1), "budget_cpu_s": round(self.budget_s, 1), "why": self.why,
                "resolved_by": self.resolved_by}


@dataclass
class PeerWatch:
    """The peers of one compile and the watches of its builds (shared by the build threads).

    ``factor`` <= 0 turns the watch off (only ``--timeout`` stops a build)."""

    say: Progress
    factor: float = HANG_FACTOR
    floor: float = HANG_FLOOR_S
    peers: dict[str, dict[str, Peer]] = field(default_factory=dict)  # toolkit -> stage -> peer
    stops: list[HangStop] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, toolkit: str, peer: Peer) -> None:
        """A build of ``toolkit`` that finished (built, or taken from the cache with its CPU time)."""
        if peer.cpu_s > 0:
            with self._lock:
                self.peers.setdefault(toolkit, {})[peer.stage] = peer

    def timed_out(self, toolkit: str, stage: str, cpu_s: float, wall_s: float, timeout: float) -> None:
        """A build of ``stage`` killed at its wall-clock ``timeout`` (no peer had judged it first)."""
        with self._lock:
            self.stops.append(HangStop(stage, toolkit, cpu_s, wall_s, timeout, f"killed at --timeout {timeout:g} s "
                                       "(wall)"))

    def budget(self, toolkit: str, stage: str, nodes: int, size_bytes: int) -> Budget | None:
        """The stage's budget from the other stages' builds of ``toolkit`` (a stage is no peer of itself)."""
        with self._lock:
            peers = [p for s, p in self.peers.get(toolkit, {}).items() if s != stage]
        return budget(peers, nodes, size_bytes, self.factor, self.floor)

    def watch(self, toolkit: str, stage: str, nodes: int, size_bytes: int, timeout: float | None) -> Watch | None:
        """The check one build of ``stage`` runs at every sample, or ``None`` when the watch is off."""
        if self.factor <= 0:
            return None
        told = False

        def check(cpu_s: float, wall_s: float) -> str | None:
            nonlocal told
            b = self.budget(toolkit, stage, nodes, size_bytes)
            if b is None:
                if not told and cpu_s > self.floor:
                    told = True
                    limit = f"--timeout {timeout:g} s" if timeout is not None else "no time limit"
                    self.say(f"[slow] {stage}: still building after {cpu_s:.0f} s of CPU ({wall_s:.0f} s wall) and "
                             f"no other build of this compile has finished to judge it by: it runs to {limit}")
                return None
            if cpu_s <= b.cpu_s:
                return None
            with self._lock:
                self.stops.append(HangStop(stage, toolkit, cpu_s, wall_s, b.cpu_s, b.why))
            self.say(f"[hang] {stage}: {cpu_s:.0f} s of CPU ({wall_s:.0f} s wall), past its budget of "
                     f"{b.cpu_s:.0f} s ({b.why}): stopped as a hang (its workarounds are tried next)")
            return f"stopped as a hang after {cpu_s:.0f} s of CPU, past {b.cpu_s:.0f} s ({b.why})"

        return check


def cpu_limit(limit_s: float) -> Watch:
    """A watch that stops a build past ``limit_s`` seconds of CPU (a reduction candidate of a hung stage)."""
    def check(cpu_s: float, _wall_s: float) -> str | None:
        if cpu_s <= limit_s:
            return None
        return f"stopped as a hang after {cpu_s:.0f} s of CPU, past {limit_s:.0f} s"

    return check


_RULE = re.compile(r"^D\s{2,}([A-Za-z_]\w*):\s+(?:remove|add) node", re.MULTILINE)


def hang_rules(log_text: str, known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The optimiser rules a build that did not return is rebuilt with turned off (``disable_rules``).

    ``known``: the rules of a known issue the build matches, taken as they are.  Else the last rule the
    log shows rewriting something: the toolkit prints a rule's rewrite when it is done, so a build that
    loops afterwards loops on the graph that rule left (RFD4's hang: ``replace_rms_norm`` took an unrelated
    ``Mul`` for the norm's weight; with it off, the stage builds in 11 s).  ``()`` when the log names no
    rule (a hang before the first rewrite, or in the native compiler)."""
    if known:
        return known
    found = _RULE.findall(log_text)
    return (found[-1],) if found else ()


__all__ = ["HANG_FACTOR", "HANG_FLOOR_S", "Budget", "HangStop", "Peer", "PeerWatch", "Watch", "budget", "cpu_limit",
           "hang_rules", "predict"]
