"""The figures of ``rkpart report``, drawn with matplotlib's Agg backend into PNG bytes.

Each function takes the tables of :mod:`rkpart.report.data` and returns PNG bytes (or
``None`` when there is nothing to draw).  PNGs are written without a timestamp, so equal
tables give equal files.
"""

from __future__ import annotations

import io
import math
from typing import Any

from rkpart.report.data import COMPONENTS, Table
from rkpart.types import NPU, JsonObject, seconds_key

NPU_COLOR, HOST_COLOR = "#2b7bba", "#f0a640"
COMPONENT_COLORS = {"load": "#8c6bb1", "init": "#2b7bba", "infer": "#41ab5d", "release": "#bdbdbd",
                    "host": "#f0a640"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # text.parse_math off: tensor, region and file names are the user's and may hold "$...$",
    # which matplotlib would otherwise parse as mathtext (and raise on)
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "svg.hashsalt": "rkpart", "path.simplify": True, "text.parse_math": False})
    return plt


def _png(fig: Any) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def stage_map(stages: Table, coverage: Table) -> bytes:
    """Rows = blocks (and shared stages), stages in execution order left to right, coloured by device."""
    plt = _plt()
    from matplotlib.patches import Patch, Rectangle

    rows = [c["row"] for c in coverage if c["row"] != "all"]
    per_row: dict[str, list[JsonObject]] = {r: [] for r in rows}
    for s in stages:
        per_row[s["row"]].append(s)
    width = max(len(v) for v in per_row.values())
    fig, ax = plt.subplots(figsize=(min(2.0 + 1.55 * width, 22), 0.8 + 0.42 * len(rows)))
    for y, r in enumerate(rows):
        for x, s in enumerate(per_row[r]):
            color = NPU_COLOR if s["device"] == NPU else HOST_COLOR
            ax.add_patch(Rectangle((x + 0.04, y + 0.08), 0.92, 0.84, facecolor=color, edgecolor="white"))
            label = s["region"] if s["device"] == NPU else s["kind"].split("+")[0]
            if s["device"] == NPU and s["cpu_ops"]:
                label += " *"
            ax.text(x + 0.5, y + 0.5, label[:16], ha="center", va="center", fontsize=7,
                    color="white" if s["device"] == NPU else "black")
    cov = {c["row"]: c for c in coverage}
    for y, r in enumerate(rows):
        c = cov[r]
        ax.text(width + 0.1, y + 0.5, f"NPU: {c['npu_ops_share'] * 100:.0f} % of ops, "
                f"{c['npu_weight_share'] * 100:.0f} % of weight bytes", va="center", fontsize=7)
    ax.set_xlim(0, width + 2.6)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.set_xticks([])
    ax.spines[["left", "bottom"]].set_visible(False)
    a = cov["all"]
    matmul = "" if a.get("npu_matmul_share") in (None, "") else \
        f"{float(a['npu_matmul_share']) * 100:.1f} % of the blocks' matmul work (MACs), "
    ax.set_title(f"Stage map: {a['npu_stages']} NPU + {a['stages'] - a['npu_stages']} host stages; on the NPU: "
                 f"{matmul}{a['npu_weight_share'] * 100:.1f} % of the weight bytes, {a['npu_ops_share'] * 100:.1f} % "
                 "of the ops (* = CPU-fallback ops)", loc="left")
    ax.legend(handles=[Patch(color=NPU_COLOR, label="NPU"), Patch(color=HOST_COLOR, label="host")],
              loc="upper right", bbox_to_anchor=(1.0, -0.02), ncol=2, frameon=False, fontsize=7)
    return _png(fig)


def lifecycle(rows: Table) -> bytes | None:
    """Per block, one stacked bar per profile: load / init / infer / release (NPU) and host time."""
    if not rows:
        return None
    plt = _plt()
    import numpy as np

    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    blocks = sorted({r["block"] for r in rows})
    n = len(profiles)
    w = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(blocks) * n + 2), 3.6))
    x0 = np.arange(len(blocks))
    by = {(r["profile"], r["block"]): r for r in rows}
    for i, p in enumerate(profiles):
        bottom = np.zeros(len(blocks))
        xs = x0 - 0.4 + w * (i + 0.5)
        for c in COMPONENTS:
            vals = np.array([by[(p, b)][seconds_key(c)] if (p, b) in by else 0.0 for b in blocks]) * 1000
            ax.bar(xs, vals, w * 0.92, bottom=bottom, color=COMPONENT_COLORS[c],
                   label=c if i == 0 else None, edgecolor="white", linewidth=0.3)
            bottom += vals
        for x, tot in zip(xs, bottom, strict=True):
            ax.text(x, tot, p, ha="center", va="bottom", fontsize=6, rotation=90 if n > 2 else 0)
    ax.set_xticks(x0, [f"block {b}" for b in blocks])
    ax.set_ylabel("ms per round (median)")
    ax.set_title("Lifecycle latency per block: " + " | ".join(profiles), loc="left")
    ax.legend(ncol=len(COMPONENTS), fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.1))
    return _png(fig)


#: measured rounds drawn per profile before the memory plot summarises (first, middle, last)
MAX_ROUNDS_DRAWN = 6


#: a memory panel: (profile name, round index)
Panel = tuple[str, int]


def _summarised_rounds(keys: list[Panel]) -> tuple[list[Panel], dict[str, str]]:
    """The (profile, round) panels to draw: every round of a profile with up to
    :data:`MAX_ROUNDS_DRAWN`, else its first, middle and last (a 110 000-record profile must not
    become thousands of subplots); per summarised profile the note its titles carry."""
    per: dict[str, list[int]] = {}
    for p, rnd in keys:
        per.setdefault(p, []).append(rnd)
    out: list[Panel] = []
    notes: dict[str, str] = {}
    for p, rounds in per.items():
        if len(rounds) > MAX_ROUNDS_DRAWN:
            picked = list(dict.fromkeys([rounds[0], rounds[len(rounds) // 2], rounds[-1]]))
            notes[p] = f" (first, middle and last of {len(rounds)} measured rounds)"
            rounds = picked
        out += [(p, r) for r in rounds]
    return out, notes


def memory_rounds_note(rows: Table) -> str:
    """What the memory plot leaves out, in words for the page (its panel titles are inside the
    image): per profile whose rounds :func:`_summarised_rounds` summarises, which ones are drawn."""
    keys = dict.fromkeys((r["profile"], r["round"]) for r in rows if not r["warmup"])
    _, notes = _summarised_rounds(list(keys))
    return "".join(f" Profile {p}: the plot shows the{n.rstrip(')').replace(' (', ' ', 1)}."
                   for p, n in notes.items())


def memory(rows: Table, budget_mib: float | None) -> bytes | None:
    """Per profile and measured round: process PSS and device memory over the round's time, and the budget."""
    measured = [r for r in rows if not r["warmup"]]
    if not measured:
        return None
    plt = _plt()
    by_key: dict[Panel, list[JsonObject]] = {}
    for r in measured:
        by_key.setdefault((r["profile"], r["round"]), []).append(r)
    keys, shown_of = _summarised_rounds(list(by_key))
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 1.9 * len(keys) + 0.4), squeeze=False, sharex=False)
    for ax, (p, rnd) in zip(axes[:, 0], keys, strict=True):
        rs = by_key[(p, rnd)]
        xs, pss, dev = [], [], []
        for r in rs:
            xs += [r["t_start_s"], r["t_end_s"]]
            pss += [(r["pss_peak_kib"] or 0) / 1024] * 2
            dev += [(r["device_pss_kib"] or 0) / 1024] * 2
        ax.plot(xs, pss, color="#555555", lw=1.2, label="process PSS (peak per stage)")
        ax.fill_between(xs, dev, step=None, color=NPU_COLOR, alpha=0.35, label="device memory (NPU)")
        ax.plot(xs, dev, color=NPU_COLOR, lw=1.2)
        if budget_mib is not None:
            ax.axhline(budget_mib, color="#d62728", ls="--", lw=1, label=f"budget {budget_mib:g} MiB")
        ax.set_title(f"{p}, round {rnd}{shown_of.get(p, '')}", loc="left", fontsize=8)
        ax.set_ylabel("MiB")
    axes[-1, 0].set_xlabel("seconds into the round")
    axes[0, 0].legend(fontsize=7, frameon=False, loc="upper right")
    fig.tight_layout()
    return _png(fig)


def _log(ax: object, which: str) -> None:
    """A log scale on ``ax``'s ``which`` axis (``"x"`` / ``"y"``) whose tick labels are plain text
    (``1e-06``): with ``text.parse_math`` off, matplotlib's default ``$\\mathdefault{10^{-6}}$``
    labels were drawn literally."""
    from matplotlib.ticker import LogFormatter, NullFormatter

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(LogFormatter(labelOnlyBase=True))
    axis.set_minor_formatter(NullFormatter())


def _nan(v: object) -> bool:
    """A metric ``rkpart run`` could not compute: ``null`` in its strict JSON (outputs holding
    NaN/Inf), or a NaN / infinity a hand-written report holds."""
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def accuracy_bars(rows: Table) -> dict[str, tuple[list[float], list[float], list[bool]]]:
    """Per run of :func:`accuracy`'s rows, in label order: the ``1 - cosine`` bars, the max-abs
    bars and which of them are NaN (outputs holding NaN/Inf).

    A NaN metric (``null`` in the run's JSON) is the worst error, never a perfect one: its bar
    reaches the axis' end (``1 - cosine`` = 2, the largest there is; max abs ten times past every
    finite one).  Before, a ``null`` cosine was read as 1 and ``max(1e-12, 1 - nan)`` as 1e-12:
    both drawn as the smallest error of the page."""
    runs = list(dict.fromkeys(r["run"] for r in rows))
    labels = list(dict.fromkeys(f"{r['stage']}:{r['tensor']}"[:40] for r in rows))
    finite_mx = [float(r["max_abs"]) for r in rows if isinstance(r.get("max_abs"), (int, float))
                 and not _nan(r["max_abs"])]
    worst_mx = max([1.0, *finite_mx]) * 10
    out = {}
    for run in runs:
        by = {f"{r['stage']}:{r['tensor']}"[:40]: r for r in rows if r["run"] == run}
        bad = [k in by and (_nan(by[k]["cosine"]) or _nan(by[k]["max_abs"])) for k in labels]
        one_minus = [2.0 if b else max(1e-12, 1.0 - by[k]["cosine"]) if k in by else 1e-12
                     for k, b in zip(labels, bad, strict=True)]
        mx = [worst_mx if b else max(1e-12, by[k]["max_abs"] or 0.0) if k in by else 1e-12
              for k, b in zip(labels, bad, strict=True)]
        out[run] = (one_minus, mx, bad)
    return out


def accuracy(rows: Table) -> bytes | None:
    """Per stage: 1 - cosine (log) and max-abs error, per run report (:func:`accuracy_bars`)."""
    if not rows:
        return None
    plt = _plt()
    import numpy as np

    labels = list(dict.fromkeys(f"{r['stage']}:{r['tensor']}"[:40] for r in rows))
    bars = accuracy_bars(rows)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 1.6 + 0.32 * len(labels)), sharey=True)
    h = 0.8 / len(bars)
    y0 = np.arange(len(labels))
    backends = {r["run"]: r.get("backend") for r in rows}
    for i, (run, (one_minus, mx, bad)) in enumerate(bars.items()):
        ys = y0 - 0.4 + h * (i + 0.5)
        a1.barh(ys, one_minus, h * 0.9, label=run)
        a2.barh(ys, mx, h * 0.9, label=f"{run} ({backends.get(run) or 'backend not recorded'})")
        for y, b, v1, v2 in zip(ys, bad, one_minus, mx, strict=True):
            if b:
                a1.text(v1, y, " NaN/Inf", color="#c0392b", fontsize=7, va="center")
                a2.text(v2, y, " NaN/Inf", color="#c0392b", fontsize=7, va="center")
    _log(a1, "x")
    _log(a2, "x")
    a1.set_yticks(y0, labels, fontsize=8)
    a1.invert_yaxis()
    a1.set_ylabel("stage : output tensor", fontsize=9)
    # the units: a cosine has none (1 - cosine: 0 = same direction, 2 = opposite); an error is in the
    # output tensor's own units; both on log scales, so the labels say so
    a1.set_xlabel("1 - cosine similarity\n(no unit, log scale; lower is better; 1e-12 or less drawn at 1e-12)",
                  fontsize=9)
    a2.set_xlabel("max |stage output - ONNX Runtime|\n(the output tensor's units, log scale)", fontsize=9)
    a1.tick_params(axis="x", labelsize=8)
    a2.tick_params(axis="x", labelsize=8)
    a1.set_title("Per-stage error against ONNX Runtime on the same inputs", loc="left", fontsize=10)
    a2.legend(title="run (backend)", fontsize=8, title_fontsize=8, frameon=False)
    fig.tight_layout(w_pad=3.0)
    return _png(fig)


def cost_model(rows: Table) -> bytes | None:
    """Predicted against measured per stage and time component (log-log), the diagonal is exact."""
    pts = [r for r in rows if r["stage"] != "total" and r["component"] not in ("device_mem", "pss_peak")
           and r["measured"] and r["predicted"]]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    comps = list(dict.fromkeys(r["component"] for r in pts))
    for c in comps:
        cs = [r for r in pts if r["component"] == c]
        ax.scatter([r["measured"] * 1000 for r in cs], [r["predicted"] * 1000 for r in cs], s=14,
                   color=COMPONENT_COLORS.get(c), label=c)
    lo = min(min(r["measured"], r["predicted"]) for r in pts) * 1000 * 0.8
    hi = max(max(r["measured"], r["predicted"]) for r in pts) * 1000 * 1.25
    ax.plot([lo, hi], [lo, hi], color="#999999", lw=0.8, ls="--")
    _log(ax, "x")
    _log(ax, "y")
    ax.set_xlabel("measured ms")
    ax.set_ylabel("predicted ms")
    ax.set_title("Cost model: predicted vs measured", loc="left")
    ax.legend(fontsize=7, frameon=False)
    return _png(fig)


__all__ = ["accuracy", "accuracy_bars", "cost_model", "lifecycle", "memory", "stage_map"]
