"""``auto``: per block, the candidate partition a cost model predicts to be fastest within budget.

The candidates (split with AdaLN on the host or on the NPU, fused, runs of fused blocks,
registered plugin strategies) and the choice are :mod:`rkpart.cost_model`'s; this strategy
only assembles the chosen groups into one :class:`Partition`.  Options:

``cost_model``       path of a model JSON (default: the shipped RK3588 calibration)
``budget_mib``       NPU device-memory budget in MiB (default: none)
``toolkit``          rknn-toolkit2 version whose known crashes exclude candidates
                     (default: the cost model's)
``steps``, ``cfg``   pipeline shape: passes = steps x (2 if cfg else 1) (default 1, True)
``residency``        ``any`` (choose per block), ``per-stage`` or ``resident``
``max_error_ratio``  accuracy floor (default: the cost model's)
``max_run``          longest run of blocks fused into one stage (default 2)
``compiled``         plan folders compiled by ``rkpart compile``: their failures exclude
                     candidates, their ``.rknn`` sizes replace estimates
``report``           callable receiving the :class:`~rkpart.cost_model.select.Selection`
                     (the CLI's ``--explain``); not recorded in the plan
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rkpart.errors import UserError
from rkpart.ir import ModelGraph
from rkpart.partitioner.discovery import Discovery
from rkpart.strategies.base import GroupBuilder, Partition, Strategy, option


def _as_list(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x for x in str(v).split(",") if x)


class AutoStrategy(Strategy):
    name = "auto"
    summary = "per block, the cheapest candidate predicted by a cost model within a memory budget"

    def propose(self, mg: ModelGraph, disc: Discovery | None, **options: Any) -> Partition:
        from rkpart.cost_model.model import load_model_or_default
        from rkpart.cost_model.select import RESIDENCIES, SelectionConfig, select

        assert disc is not None
        model_path = options.get("cost_model")
        model = load_model_or_default(model_path)
        residency = option(options, "residency", "any", ("any", *RESIDENCIES))
        budget = options.get("budget_mib")
        try:
            cfg = SelectionConfig(
                budget_mib=None if budget is None else float(budget),
                toolkit=None if options.get("toolkit") is None else str(options["toolkit"]),
                steps=int(option(options, "steps", 1)),
                cfg=bool(option(options, "cfg", True)),
                residencies=RESIDENCIES if residency == "any" else (residency,),
                max_error_ratio=None if options.get("max_error_ratio") is None else float(options["max_error_ratio"]),
                max_run=int(option(options, "max_run", 2)),
                compiled=_as_list(options.get("compiled")),
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"auto strategy: bad option: {e}") from None
        if cfg.budget_mib is not None and cfg.budget_mib <= 0:
            raise UserError(f"budget_mib must be > 0, got {cfg.budget_mib:g}")
        sel = select(mg, disc, model, cfg)
        report: Callable[[Any], None] | None = options.get("report")
        if report is not None:
            report(sel)
        gb = GroupBuilder()
        for o in sel.chosen:
            for g in o.candidate.groups:
                gb.add(g.id, set(g.ops), device=g.device, region=g.region, kind=g.kind, block=g.block,
                       blocks=g.blocks)
        gb.add_host_rest(mg, disc)
        recorded = {
            "cost_model": "shipped:rk3588_calibration" if model_path is None else str(model_path),
            "cost_model_sha256": model.sha256,
            "budget_mib": cfg.budget_mib,
            "toolkit": sel.toolkit,
            "steps": cfg.steps,
            "cfg": cfg.cfg,
            "residency": residency,
            "max_error_ratio": sel.max_error_ratio,
            "max_run": cfg.max_run,
            "choices": [{"blocks": list(o.candidate.blocks), "candidate": o.candidate.id, "residency": o.residency}
                        for o in sel.chosen],
            "predicted_latency_s": round(sel.latency, 6),
            "predicted_device_mib": round(sel.device_bytes / 2**20, 2),
        }
        notes = tuple(f"block {','.join(map(str, o.candidate.blocks))}: {o.candidate.id} ({o.residency})"
                      for o in sel.chosen) + tuple(sel.notes)
        return gb.build(self.name, recorded, notes=notes)
