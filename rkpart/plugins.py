"""Entry-point plugins: strategies (``rkpart.strategies``) and block recognisers (``rkpart.recognizers``).

Like NetworkX's backends, every entry point of a group is loaded once per process and
classified: *loaded*, *broken* (import failed, or the object is not what the group needs),
*duplicate* (a second entry point with a name already taken) or *shadowed* (a name a
built-in already has).  Nothing here raises: a broken plugin is reported by ``rkpart
strategies`` / ``rkpart recognizers`` and skipped, and the rest of rkpart keeps working.

A plugin package declares, in its ``pyproject.toml``::

    [project.entry-points."rkpart.strategies"]
    every_op = "my_plugin:EveryOpStrategy"      # a Strategy subclass, name = "every_op"

    [project.entry-points."rkpart.recognizers"]
    bert = "my_plugin:recognizer"                # an object with name = "bert" and recognize(mg)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from rkpart.errors import describe_exception
from rkpart.types import JsonObject

STRATEGY_GROUP = "rkpart.strategies"
RECOGNIZER_GROUP = "rkpart.recognizers"

#: checks an entry point's object for a group: returns an error message, or None when it is fine
Checker = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class PluginInfo:
    """One entry point of a plugin group and what became of it."""

    name: str
    group: str
    value: str  # "module:attr"
    dist: str  # "package==version", or "?" when the entry point has no distribution
    status: str  # "loaded", "broken", "duplicate", "shadowed"
    error: str = ""
    obj: Any = field(default=None, compare=False, repr=False)

    @property
    def origin(self) -> str:
        return f"{self.dist} ({self.value})"


@dataclass
class PluginSet:
    """Every entry point of one group, in name order."""

    group: str = ""
    entries: tuple[PluginInfo, ...] = ()
    loaded: JsonObject = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # name -> "dist==version (module:attr)"
    broken: dict[str, str] = field(default_factory=dict)  # name -> one-line error (broken, duplicate, shadowed)


def _entry_points(group: str) -> list[metadata.EntryPoint]:
    eps = sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value, _dist(e)))
    out: list[metadata.EntryPoint] = []
    seen: set[tuple[str, str, str]] = set()
    for ep in eps:
        # the same distribution found twice on sys.path (editable + regular install, or a
        # path listed twice) is one plugin, not a duplicate
        key = (ep.name, ep.value, _dist(ep))
        if key not in seen:
            seen.add(key)
            out.append(ep)
    return out


def _dist(ep: metadata.EntryPoint) -> str:
    d = ep.dist
    return f"{d.name}=={d.version}" if d is not None else "?"


@functools.cache
def load_plugins(group: str, builtin: tuple[str, ...] = (), check: Checker | None = None) -> PluginSet:
    """Load (once per process) every entry point of ``group``; never raises.

    Parameters
    ----------
    group
        ``"rkpart.strategies"`` or ``"rkpart.recognizers"``.
    builtin
        Names the built-ins already use: plugins with those names are reported as shadowed.
    check
        What the group needs of an entry point's object: returns an error message or ``None``.
        The package that owns the group passes it (:mod:`rkpart.grouping.strategies`,
        :mod:`rkpart.discovery.recognizers`), so this module imports neither.

    Returns
    -------
    PluginSet
        ``loaded`` maps names to objects; ``broken`` maps names to a one-line reason.

    Notes
    -----
    The result is cached; tests that change ``sys.path`` call ``load_plugins.cache_clear()``.
    """
    entries: list[PluginInfo] = []
    out = PluginSet(group=group)
    for ep in _entry_points(group):
        dist = _dist(ep)
        info = functools.partial(PluginInfo, name=ep.name, group=group, value=ep.value, dist=dist)
        if ep.name in builtin:
            entries.append(info(status="shadowed", error=f"name {ep.name!r} is taken by a built-in; ignored"))
            continue
        if ep.name in out.loaded:
            entries.append(info(status="duplicate",
                                error=f"name {ep.name!r} is also provided by {out.origin[ep.name]}; ignored"))
            continue
        try:
            obj = ep.load()
            err = check(obj) if check else None
            name = getattr(obj, "name", None)
            if err is None and not name:
                err = "object has no 'name'"
            elif err is None and name != ep.name:
                err = f"entry point name {ep.name!r} differs from the object's name {name!r}"
        except Exception as e:  # noqa: BLE001 - a plugin may raise anything on import; it must not take rkpart down
            entries.append(info(status="broken", error=describe_exception(e)))
            continue
        if err is not None:
            entries.append(info(status="broken", error=err))
            continue
        entries.append(info(status="loaded", obj=obj))
        out.loaded[ep.name] = obj
        out.origin[ep.name] = f"{dist} ({ep.value})"
    out.entries = tuple(entries)
    for entry in entries:
        if entry.status != "loaded" and entry.name not in out.loaded:
            out.broken.setdefault(entry.name, f"{entry.error} [{entry.origin}]")
    return out


def describe(builtins: Iterable[tuple[str, str, str]], plugins: PluginSet) -> list[dict[str, str]]:
    """Rows for ``rkpart strategies`` / ``rkpart recognizers``: built-ins, then every entry point.

    ``builtins`` are ``(name, summary, where)`` triples.
    """
    rows = [{"name": n, "status": "built-in", "summary": s, "origin": w} for n, s, w in builtins]
    for e in plugins.entries:
        summary = getattr(e.obj, "summary", "") if e.status == "loaded" else e.error
        rows.append({"name": e.name, "status": e.status if e.status != "loaded" else "plugin",
                     "summary": summary or "", "origin": e.origin})
    return rows


def render(rows: list[dict[str, str]]) -> str:
    """A plain table: name, status (BROKEN etc. in capitals), summary or error, origin."""
    width = max([4, *(len(r["name"]) for r in rows)])
    lines = []
    for r in rows:
        status = r["status"] if r["status"] in ("built-in", "plugin") else r["status"].upper()
        lines.append(f"{r['name']:<{width}}  {status:<9}  {r['summary']}  [{r['origin']}]")
    return "\n".join(lines)


__all__ = ["RECOGNIZER_GROUP", "STRATEGY_GROUP", "PluginInfo", "PluginSet", "describe", "load_plugins", "render"]
