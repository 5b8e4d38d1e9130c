"""Partition strategies: the built-in list, and plugins from the ``rkpart.strategies`` entry point."""

from __future__ import annotations

from rkpart.errors import UserError
from rkpart.plugins import STRATEGY_GROUP, PluginSet, load_plugins
from rkpart.strategies.auto import AutoStrategy
from rkpart.strategies.base import Group, Partition, Strategy
from rkpart.strategies.custom import CustomStrategy
from rkpart.strategies.fused import FusedStrategy
from rkpart.strategies.generic import GenericStrategy
from rkpart.strategies.split import SplitStrategy

#: built-in strategies, in the order ``rkpart strategies`` lists them
BUILTIN: tuple[type[Strategy], ...] = (SplitStrategy, FusedStrategy, CustomStrategy, GenericStrategy,
                                          AutoStrategy)


def plugins() -> PluginSet:
    """The ``rkpart.strategies`` entry points (loaded once per process)."""
    return load_plugins(STRATEGY_GROUP, tuple(s.name for s in BUILTIN))


def available() -> dict[str, type[Strategy]]:
    """Every strategy by name: built-ins first, then plugins that loaded."""
    out: dict[str, type[Strategy]] = {s.name: s for s in BUILTIN}
    for name, cls in plugins().loaded.items():
        out.setdefault(name, cls)
    return out


def get_strategy(name: str) -> Strategy:
    strategies = available()
    if name not in strategies:
        broken = plugins().broken.get(name)
        if broken:
            raise UserError(f"strategy plugin {name!r} failed to load: {broken}")
        raise UserError(f"unknown strategy {name!r} (available: {', '.join(strategies)})")
    return strategies[name]()


__all__ = ["BUILTIN", "Group", "Partition", "Strategy", "available", "get_strategy", "plugins"]
