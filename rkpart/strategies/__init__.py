"""Kept for plugins: the strategy registry at the path plugins import.

The strategies live in :mod:`rkpart.grouping.strategies`; ``rkpart.strategies`` and
``rkpart.strategies.base`` (``propose_with``, ``docs/plugins.md``) keep working (``tests/plugins``
checks it).  New code imports :mod:`rkpart.grouping.strategies` or the public names of :mod:`rkpart`.
"""

from rkpart.grouping.strategies import (
    BUILTIN,
    RESERVED,
    Group,
    Partition,
    Strategy,
    available,
    check_plugin,
    get_strategy,
    plugins,
)

__all__ = ["BUILTIN", "RESERVED", "Group", "Partition", "Strategy", "available", "check_plugin", "get_strategy",
           "plugins"]
