"""Entry-point plugins (strategies, block recognisers); load failures are reported, never fatal."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any


@dataclass
class PluginSet:
    loaded: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # name -> "dist==version (module:attr)"
    broken: dict[str, str] = field(default_factory=dict)  # name -> one-line error


@functools.cache
def load_plugins(group: str) -> PluginSet:
    out = PluginSet()
    eps = sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value))
    for ep in eps:
        dist = f"{ep.dist.name}=={ep.dist.version}" if ep.dist else "?"
        where = f"{dist} ({ep.value})"
        if ep.name in out.loaded:
            out.broken[ep.name] = f"duplicate name, also provided by {out.origin[ep.name]}; ignored {where}"
            continue
        try:
            obj = ep.load()
            name = getattr(obj, "name", None)
            if not name:
                raise TypeError("object has no 'name'")
            if name != ep.name:
                raise TypeError(f"entry point name {ep.name!r} differs from its name {name!r}")
        except Exception as e:
            out.broken[ep.name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} [{where}]"
            continue
        out.loaded[ep.name] = obj
        out.origin[ep.name] = where
    return out
