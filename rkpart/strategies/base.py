"""Kept for plugins: what a strategy is, at the path ``docs/plugins.md`` names (:func:`propose_with`).

It lives in :mod:`rkpart.grouping.strategies.base`.
"""

from rkpart.grouping.strategies.base import (
    Group,
    GroupBuilder,
    Partition,
    Strategy,
    block_id,
    check_strategy_options,
    option,
    propose_with,
)

__all__ = ["Group", "GroupBuilder", "Partition", "Strategy", "block_id", "check_strategy_options", "option",
           "propose_with"]
