"""Partition strategies: the built-in list, and plugins from the ``rkpart.strategies`` entry point."""

from __future__ import annotations

from rkpart.errors import UserError
from rkpart.strategies.base import Group, Partition, Strategy
from rkpart.strategies.custom import CustomStrategy
from rkpart.strategies.fused import FusedStrategy
from rkpart.strategies.split import SplitStrategy

#: built-in strategies, in the order ``rkpart strategies`` lists them
BUILTIN: tuple[type[Strategy], ...] = (SplitStrategy, FusedStrategy, CustomStrategy)


def available() -> dict[str, type[Strategy]]:
    """Every strategy by name: built-ins first, then plugins that loaded."""
    from rkpart.plugins import load_plugins

    out: dict[str, type[Strategy]] = {s.name: s for s in BUILTIN}
    for name, cls in load_plugins("rkpart.strategies").loaded.items():
        out.setdefault(name, cls)
    return out


def get_strategy(name: str) -> Strategy:
    strategies = available()
    if name not in strategies:
        raise UserError(f"unknown strategy {name!r} (available: {', '.join(strategies)})")
    return strategies[name]()


__all__ = ["BUILTIN", "Group", "Partition", "Strategy", "available", "get_strategy"]
