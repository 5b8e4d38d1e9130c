"""Partition strategies: the built-in list, and plugins from the ``rkpart.strategies`` entry point.

These strategies need only the graph and its discovery.  ``auto``, which asks the cost model
to choose among the others' partitions, sits above the cost model in :mod:`rkpart.pipeline`;
:func:`rkpart.pipeline.get_strategy` and :func:`rkpart.pipeline.available` know every one.
"""

from __future__ import annotations

from collections.abc import Sequence

from rkpart.errors import UserError
from rkpart.grouping.strategies.base import Group, Partition, Strategy
from rkpart.grouping.strategies.custom import CustomStrategy
from rkpart.grouping.strategies.fused import FusedStrategy
from rkpart.grouping.strategies.generic import GenericStrategy
from rkpart.grouping.strategies.split import SplitStrategy
from rkpart.plugins import STRATEGY_GROUP, PluginSet, load_plugins

#: built-in strategies, in the order ``rkpart strategies`` lists them
BUILTIN: tuple[type[Strategy], ...] = (SplitStrategy, FusedStrategy, CustomStrategy, GenericStrategy)


#: names of strategies built in above this package (:mod:`rkpart.pipeline`'s ``auto``): a
#: plugin cannot take them
RESERVED: tuple[str, ...] = ("auto",)


def check_plugin(obj: object) -> str | None:
    """Why an ``rkpart.strategies`` entry point's object is unusable, or ``None``."""
    if not (isinstance(obj, type) and issubclass(obj, Strategy)):
        return f"{obj!r} is not a subclass of rkpart.strategies.base.Strategy"
    return None


def plugins() -> PluginSet:
    """The ``rkpart.strategies`` entry points (loaded once per process)."""
    return load_plugins(STRATEGY_GROUP, (*(s.name for s in BUILTIN), *RESERVED), check_plugin)


def available(builtin: Sequence[type[Strategy]] = BUILTIN) -> dict[str, type[Strategy]]:
    """Every strategy by name: ``builtin`` first, then plugins that loaded.

    :mod:`rkpart.pipeline` passes its longer list (with ``auto``).
    """
    out: dict[str, type[Strategy]] = {s.name: s for s in builtin}
    for name, cls in plugins().loaded.items():
        out.setdefault(name, cls)
    return out


def get_strategy(name: str, builtin: Sequence[type[Strategy]] = BUILTIN) -> Strategy:
    """A new instance of the strategy ``name`` (among ``builtin`` and the plugins).

    Raises
    ------
    UserError
        Unknown name (the message lists the available ones) or a plugin that failed to load.
    """
    strategies = available(builtin)
    if name not in strategies:
        broken = plugins().broken.get(name)
        if broken:
            raise UserError(f"strategy plugin {name!r} failed to load: {broken}")
        raise UserError(f"unknown strategy {name!r} (available: {', '.join(strategies)})")
    return strategies[name]()


__all__ = ["BUILTIN", "RESERVED", "Group", "Partition", "Strategy", "available", "check_plugin", "get_strategy",
           "plugins"]
