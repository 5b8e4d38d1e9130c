"""The write-up's two tables, computed from profile records.

Latency: Model Load / Runtime Init / NPU Inference (xN) / Context Release / Host AdaLN &
Residual / Net Component Sum / Measured Wall (+ the measurement overhead inside it).
Memory: NPU device-mapped PSS / peak process PSS / new system swap.

Every value is the median over the measured rounds of a per-round total (see
:func:`rkpart.profile.records.round_totals`); ``±`` is half the min-max spread over rounds.
Deltas are ``B - A`` and percentages ``(B - A) / A``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rkpart.errors import SpecError
from rkpart.profile.records import aggregate, passes_per_round
from rkpart.types import JsonMap

TIME_ROWS = (
    ("load_s", "Model Load"),
    ("init_s", "Runtime Init"),
    ("infer_s", "NPU Inference"),
    ("release_s", "Context Release"),
    ("host_s", "Host AdaLN & Residual"),
    ("net_s", "Net Component Sum"),
    ("wall_s", "Measured Wall"),
    ("measurement_s", "  of which measuring"),
)
MEMORY_ROWS = (
    ("device_pss_kib", "NPU Device-Mapped PSS"),
    ("pss_peak_kib", "Peak Process PSS"),
    ("swap_new_kib", "New System Swap"),
)


@dataclass(frozen=True)
class Row:
    """One compared quantity: medians, spreads, delta and percent (``None`` if unknown)."""

    key: str
    label: str
    a: float | None
    b: float | None
    a_spread: float | None
    b_spread: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def percent(self) -> float | None:
        d = self.delta
        if d is None or not self.a:
            return None
        return 100.0 * d / self.a


def compare_rows(
    a: Sequence[JsonMap], b: Sequence[JsonMap], block: int | None = None
) -> tuple[list[Row], list[Row]]:
    """Time rows and memory rows comparing profile ``a`` with profile ``b``.

    Raises
    ------
    SpecError
        If either profile has no measured (non-warm-up) stage records for ``block``.
    """
    agg_a, agg_b = aggregate(a, block), aggregate(b, block)
    for name, agg in (("A", agg_a), ("B", agg_b)):
        if agg["net_s"]["n"] == 0:
            where = "the plan" if block is None else f"block {block}"
            raise SpecError(f"profile {name} has no measured stage records for {where}")
    na, nb = passes_per_round(a), passes_per_round(b)
    times = [_row(k, _label(k, lab, na, nb), agg_a, agg_b) for k, lab in TIME_ROWS]
    mems = [_row(k, lab, agg_a, agg_b) for k, lab in MEMORY_ROWS]
    return times, mems


def _label(key: str, label: str, na: int, nb: int) -> str:
    if key != "infer_s":
        return label
    return f"{label} (×{na})" if na == nb else f"{label} (×{na}/×{nb})"


def _row(key: str, label: str, agg_a: JsonMap, agg_b: JsonMap) -> Row:
    sa, sb = agg_a[key], agg_b[key]
    return Row(key, label, sa["median"], sb["median"], sa["spread"], sb["spread"])


# -- formatting ----------------------------------------------------------------------------
def _sec(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f} s"


def _pm(v: float | None, unit: str) -> str:
    if v is None or v == 0:
        return ""
    return f" ±{v / 2:.4f}" if unit == "s" else f" ±{round(v / 2):,}"


def _signed_sec(v: float) -> str:
    return f"{v:+.4f} s"


def _kib(v: float | None) -> str:
    return "n/a" if v is None else f"{round(v):,} KiB"


def format_time_delta(row: Row) -> str:
    d, p = row.delta, row.percent
    if d is None:
        return "n/a"
    return _signed_sec(d) + ("" if p is None else f" ({p:+.2f}%)")


def format_memory_delta(row: Row) -> str:
    d, p = row.delta, row.percent
    if d is None:
        return "n/a"
    if d == 0:
        return "0 KiB"
    extra = f"{d / 1024:+.2f} MiB" + ("" if p is None else f", {p:+.1f}%")
    return f"{round(d):+,} KiB ({extra})"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return out


def describe_run(records: Sequence[JsonMap]) -> str:
    """One line naming what a profile measured."""
    r = records[0]
    s, p = r["settings"], r["plan"]
    measured = aggregate(records)["net_s"]["n"]
    return (
        f"strategy {p['strategy'] or '?'}, {p['stages']} stage(s), backend {s['backend']}, "
        f"{measured} measured round(s) + {s['warmup']} warm-up, {'CFG' if s['cfg'] else 'no CFG'}, "
        f"{s['steps']} step(s), residency {s['residency']}"
    )


def render_compare(
    a: Sequence[JsonMap],
    b: Sequence[JsonMap],
    *,
    names: tuple[str, str] = ("A", "B"),
    block: int | None = None,
) -> str:
    """The two tables for profiles ``a`` and ``b`` side by side, as text."""
    times, mems = compare_rows(a, b, block)
    scope = "whole plan (sum over stages per round)" if block is None else f"block {block}"
    head = [
        f"Scope: {scope}; medians over measured rounds, ± half the spread; delta = B - A",
        f"A: {names[0]}: {describe_run(a)}",
        f"B: {names[1]}: {describe_run(b)}",
        "",
    ]
    t_rows = [
        [r.label, _sec(r.a) + _pm(r.a_spread, "s"), _sec(r.b) + _pm(r.b_spread, "s"), format_time_delta(r)]
        for r in times
    ]
    m_rows = [
        [r.label, _kib(r.a) + _pm(r.a_spread, "k"), _kib(r.b) + _pm(r.b_spread, "k"), format_memory_delta(r)]
        for r in mems
    ]
    lines = head + _table(["Execution Stage & Component", "A", "B", "Delta"], t_rows)
    lines += ["", *_table(["Memory Metric", "A", "B", "Difference & Rate of Change"], m_rows)]
    return "\n".join(lines) + "\n"


def render_single(records: Sequence[JsonMap], *, name: str = "", block: int | None = None) -> str:
    """The two tables for one profile (what ``rkpart profile`` prints after a run)."""
    agg = aggregate(records, block)
    n = passes_per_round(records)
    head = [f"{name + ': ' if name else ''}{describe_run(records)}", ""]
    t_rows = [
        [_label(k, lab, n, n), _sec(agg[k]["median"]) + _pm(agg[k]["spread"], "s")] for k, lab in TIME_ROWS
    ]
    m_rows = [[lab, _kib(agg[k]["median"]) + _pm(agg[k]["spread"], "k")] for k, lab in MEMORY_ROWS]
    lines = head + _table(["Execution Stage & Component", "Median"], t_rows)
    lines += ["", *_table(["Memory Metric", "Median"], m_rows)]
    base = baseline_line(records)
    if base is not None:
        lines += ["", base]
    return "\n".join(lines) + "\n"


def baseline_line(records: Sequence[JsonMap]) -> str | None:
    """The plan's overhead against the whole model (``--baseline``), or ``None`` without one."""
    b = next((r.get("baseline") for r in reversed(records) if r.get("record") == "summary"), None)
    if not b or b["whole_s"]["median"] is None:
        return None
    w, i, n = b["whole_s"]["median"], b["plan_infer_s"]["median"], b["plan_net_s"]["median"]

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    return (f"whole model {_sec(w)} per round; plan inference {_sec(i)} ({ratio(b['infer_ratio'])}), "
            f"plan round without measurement {_sec(n)} ({ratio(b['net_ratio'])})")
