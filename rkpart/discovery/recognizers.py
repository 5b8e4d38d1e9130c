"""Block recognisers: teach discovery an architecture without forking rkpart.

A recogniser is any object with a ``name`` and a ``recognize(mg) -> Discovery | None``
method (the :class:`Recognizer` protocol); ``summary`` (one line) and ``stage`` are
optional.  :func:`discover` consults them around the built-in structural discovery
(:func:`rkpart.discovery.structure.discover`, the residual-chain analysis):

1. recognisers with ``stage = "before"`` (the default), in name order: the first one that
   returns a :class:`Discovery` wins.  Use this to *name* regions of a structure the
   built-in analysis already finds (call :func:`structural` and :func:`relabel` the
   result), or to take over an architecture completely.
2. the built-in structural discovery.
3. only if that finds no blocks: recognisers with ``stage = "after"``, then the built-in
   :class:`ScopeRecognizer` fallback (blocks from numbered module scopes such as
   ``/encoder/layer.3/``, which is what a post-norm BERT-style encoder needs: its residual
   adds are separated by LayerNorms, so they do not chain).

Returning ``None`` means "not my architecture".  A recogniser that raises something other
than a :class:`~rkpart.errors.UserError` is skipped with a note, like a plugin that fails
to load; a :class:`Discovery` it returns is checked (:func:`check_discovery`) before use.

Plugins register recognisers through the ``rkpart.recognizers`` entry point group; the
entry point names an *instance* (see :mod:`rkpart.plugins`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from rkpart.discovery.structure import Block, Discovery, Region
from rkpart.discovery.structure import discover as structural
from rkpart.errors import DiscoveryError, UserError, describe_exception
from rkpart.ir import ModelGraph
from rkpart.plugins import RECOGNIZER_GROUP, PluginSet, load_plugins
from rkpart.progress import Progress, silent

STAGES = ("before", "after")


@runtime_checkable
class Recognizer(Protocol):
    """What discovery needs from a recogniser (``summary`` and ``stage`` are optional)."""

    name: str

    def recognize(self, mg: ModelGraph) -> Discovery | None:
        """Blocks of ``mg``, or ``None`` if this recogniser does not know the architecture."""


def stage_of(r: object) -> str:
    s = getattr(r, "stage", "before")
    return s if s in STAGES else "before"


# ---------------------------------------------------------------------------------------------
# building discoveries


def discovery_from_blocks(
    mg: ModelGraph,
    blocks: Sequence[Mapping[str, Iterable[int]]],
    *,
    method: str,
    block_ops: Sequence[Iterable[int]] | None = None,
    scopes: Sequence[str] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> Discovery:
    """A :class:`Discovery` from op sets: ``blocks[k]`` maps region names to op indices.

    Parameters
    ----------
    mg
        The model the op indices refer to (``mg.op(i)``).
    blocks
        One mapping per block, in execution order: region name -> op indices.  Regions
        become NPU stages under ``split``; whole blocks under ``fused``.
    method
        Recorded as ``Discovery.method`` (e.g. ``"recognizer:bert"``).
    block_ops
        Further ops of each block that belong to no region (e.g. post-norm LayerNorms and
        residual adds): host ops under ``split``, inside the stage under ``fused``.
    scopes
        A label per block (``"encoder.layer.3"``).
    kinds
        Region name -> kind (``self_attention``, ``ffn``, ...); default ``"other"``.

    Returns
    -------
    Discovery
        Ops in no block are the prologue (before the first block), the epilogue (after the
        last) or glue (in between), by model order.

    Examples
    --------
    >>> disc = discovery_from_blocks(mg, [{"attn": {3, 4}, "ffn": {6, 7}}], method="mine")  # doctest: +SKIP
    """
    kinds = kinds or {}
    built: list[Block] = []
    covered: set[int] = set()
    for k, regions in enumerate(blocks):
        regs = tuple(
            Region(name=rn, kind=kinds.get(rn, "other"), branches=(), adaln="none", side=frozenset(ops))
            for rn, ops in regions.items()
        )
        extra = frozenset(block_ops[k]) if block_ops is not None else frozenset()
        extra -= frozenset().union(*(r.side for r in regs))
        b = Block(index=k, regions=regs, mod=extra, scope=scopes[k] if scopes else "")
        built.append(b)
        covered |= b.ops
    rest = [i for i in sorted(mg.ops.nodes) if i not in covered]
    first = min(covered) if covered else 0
    last = max(covered) if covered else -1
    disc = Discovery(
        blocks=tuple(built),
        prologue=frozenset(i for i in rest if i < first),
        glue=frozenset(i for i in rest if first < i < last),
        epilogue=frozenset(i for i in rest if i > last),
        streams=1,
        method=method,
    )
    check_discovery(mg, disc, method)
    return disc


def relabel(disc: Discovery, names: Mapping[str, str] | Callable[[Region], str], *, method: str | None = None
            ) -> Discovery:
    """A new discovery with regions renamed (``{"attn": "self_attn"}`` or a function of the region).

    Examples
    --------
    >>> disc = relabel(structural(mg), {"ffn": "mlp"}, method="recognizer:vit")  # doctest: +SKIP
    """
    def new_name(r: Region) -> str:
        return names(r) if callable(names) else names.get(r.name, r.name)

    blocks = tuple(
        Block(index=b.index, mod=b.mod, scope=b.scope, regions=tuple(
            Region(name=new_name(r), kind=r.kind, branches=r.branches, adaln=r.adaln, side=r.side, mod=r.mod)
            for r in b.regions))
        for b in disc.blocks
    )
    return Discovery(blocks=blocks, prologue=disc.prologue, glue=disc.glue, epilogue=disc.epilogue,
                     streams=disc.streams, method=method or disc.method, notes=disc.notes)


def check_discovery(mg: ModelGraph, disc: Discovery, who: str) -> None:
    """Refuse a discovery whose op sets overlap or name ops that are not in ``mg.ops``."""
    valid = set(mg.ops.nodes)
    owner: dict[int, str] = {}
    parts: list[tuple[str, frozenset[int]]] = [("prologue", disc.prologue), ("glue", disc.glue),
                                                ("epilogue", disc.epilogue)]
    if not disc.blocks:
        raise DiscoveryError(f"{who}: discovery has no blocks")
    for b in disc.blocks:
        names = [r.name for r in b.regions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DiscoveryError(f"{who}: block {b.index} has two regions named {dup[0]!r}")
        parts += [(f"block {b.index} region {r.name}", r.ops) for r in b.regions]
        parts.append((f"block {b.index} (outside regions)", b.mod))
    for label, ops in parts:
        for i in sorted(ops):
            if i not in valid:
                raise DiscoveryError(f"{who}: {label} names op {i}, which is not a non-constant op of the model")
            if i in owner and owner[i] != label:
                raise DiscoveryError(f"{who}: op {i} ({mg.op(i).name}) is in both {owner[i]} and {label}")
            owner[i] = label


# ---------------------------------------------------------------------------------------------
# the built-in fallback: blocks from numbered module scopes

_NUMBERED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[./](\d+)(?=[/.]|$)")


class ScopeRecognizer:
    """Blocks from numbered module scopes in the exporter's names (``/encoder/layer.3/...``).

    Parameters
    ----------
    name
        The recogniser's name.
    block_pattern
        Regex searched in each op's scope (:attr:`OpNode.scope`) whose first group is
        the block number.  Default: the numbered scope (``<prefix>/<name>.<N>``) with at
        least two numbers that covers the most ops.
    region_pattern
        Regex searched in the part of the scope after the block match; its first group
        names the op's region (e.g. ``r"^/(attention|intermediate|output)/"``).  Ops of the
        block it does not match belong to the block but to no region.  Default: one region
        ``"block"`` per block.
    stage
        ``"after"`` (only when the structural discovery finds nothing) or ``"before"``.

    Examples
    --------
    >>> bert = ScopeRecognizer("bert", r"/encoder/layer\\.(\\d+)/", r"^/?(attention|intermediate)/")
    >>> bert.name
    'bert'
    """

    def __init__(self, name: str, block_pattern: str | None = None, region_pattern: str | None = None, *,
                 stage: str = "after", summary: str = "") -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        self.name = name
        self.block_pattern = re.compile(block_pattern) if block_pattern else None
        self.region_pattern = re.compile(region_pattern) if region_pattern else None
        self.stage = stage
        self.summary = summary or (
            f"blocks from module scopes matching {block_pattern!r}" if block_pattern
            else "blocks from numbered module scopes (/layer.N/...), when residual chains find none")

    def _block_of(self, mg: ModelGraph) -> dict[int, tuple[int, str, str]]:
        """op -> (block number, block label, scope remainder)."""
        out: dict[int, tuple[int, str, str]] = {}
        if self.block_pattern is not None:
            for i in mg.ops.nodes:
                m = self.block_pattern.search(mg.op(i).scope)
                if m:
                    out[i] = (int(m.group(1)), m.group(0).strip("/"), mg.op(i).scope[m.end():])
            return out
        # auto: (prefix, name) keys of numbered scope components, the best-covering one wins
        found: dict[int, tuple[tuple[str, str], int, str, str]] = {}
        votes: Counter[tuple[str, str]] = Counter()
        numbers: dict[tuple[str, str], set[int]] = {}
        for i in mg.ops.nodes:
            for m in _NUMBERED.finditer(mg.op(i).scope):
                key = (mg.op(i).scope[:m.start()], m.group(1))
                found.setdefault(i, (key, int(m.group(2)), m.group(0), mg.op(i).scope[m.end():]))
                votes[key] += 1
                numbers.setdefault(key, set()).add(int(m.group(2)))
                break
        keys = [k for k, _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])) if len(numbers[k]) >= 2]
        if not keys:
            return out
        best = keys[0]
        for i, (key, num, label, rest) in found.items():
            if key == best:
                out[i] = (num, f"{best[0].strip('/')}/{label}".strip("/"), rest)
        return out

    def recognize(self, mg: ModelGraph) -> Discovery | None:
        of = self._block_of(mg)
        if not of:
            return None
        numbers = sorted({b for b, _, _ in of.values()})
        if len(numbers) < 2 and self.block_pattern is None:
            return None
        blocks: list[dict[str, set[int]]] = []
        extra: list[set[int]] = []
        labels: list[str] = []
        for num in numbers:
            ops = sorted(i for i, (b, _, _) in of.items() if b == num)
            regions: dict[str, set[int]] = {}
            rest: set[int] = set()
            for i in ops:
                if self.region_pattern is None:
                    regions.setdefault("block", set()).add(i)
                    continue
                m = self.region_pattern.search(of[i][2])
                if m:
                    regions.setdefault(m.group(1), set()).add(i)
                else:
                    rest.add(i)
            if not regions:
                regions = {"block": rest}
                rest = set()
            blocks.append(regions)
            extra.append(rest)
            labels.append(of[ops[0]][1])
        return discovery_from_blocks(mg, blocks, method=f"recognizer:{self.name}", block_ops=extra, scopes=labels)


#: built-in recognisers, consulted after installed plugins of the same stage
BUILTIN: tuple[ScopeRecognizer, ...] = (ScopeRecognizer("scopes"),)


# ---------------------------------------------------------------------------------------------


def check_plugin(obj: object) -> str | None:
    """Why an ``rkpart.recognizers`` entry point's object is unusable, or ``None``."""
    if not callable(getattr(obj, "recognize", None)):
        return f"{obj!r} has no recognize(mg) method"
    if isinstance(obj, type):
        return f"{obj.__name__} is a class; the entry point must name an instance"
    return None


def plugins() -> PluginSet:
    """The ``rkpart.recognizers`` entry points (loaded once per process)."""
    return load_plugins(RECOGNIZER_GROUP, tuple(r.name for r in BUILTIN), check_plugin)


def installed() -> list[Recognizer]:
    """Plugins that loaded, then the built-ins."""
    return [*plugins().loaded.values(), *BUILTIN]


def discover(
    mg: ModelGraph,
    *,
    recognizers: Sequence[Recognizer] | None = None,
    min_blocks: int = 1,
    notes: list[str] | None = None,
) -> Discovery:
    """Blocks and regions of ``mg``: recognisers around the built-in structural discovery.

    Parameters
    ----------
    mg
        A loaded model (:func:`rkpart.load_model`).
    recognizers
        Recognisers to consult; default :func:`installed` (plugins, then built-ins).  Pass
        ``[]`` for the structural discovery alone.
    min_blocks
        Fewer blocks than this is a :class:`DiscoveryError`.
    notes
        If given, receives one line per recogniser that was skipped because it raised.

    Raises
    ------
    DiscoveryError
        Nothing found blocks (the structural discovery's message, naming the recognisers
        that were tried).

    Examples
    --------
    >>> import rkpart
    >>> mg = rkpart.load_model("vit.onnx")  # doctest: +SKIP
    >>> disc = rkpart.discover(mg)  # doctest: +SKIP
    >>> [r.name for r in disc.blocks[0].regions]  # doctest: +SKIP
    ['attn', 'ffn']
    """
    recs = list(installed() if recognizers is None else recognizers)
    skipped = notes if notes is not None else []
    before = sorted((r for r in recs if stage_of(r) == "before"), key=lambda r: r.name)
    after = [r for r in recs if stage_of(r) == "after"]
    for r in before:
        d = _consult(r, mg, skipped)
        if d is not None and len(d.blocks) >= min_blocks:
            return d
    try:
        return structural(mg, min_blocks=min_blocks)
    except DiscoveryError as e:
        err = e
    for r in after:
        d = _consult(r, mg, skipped)
        if d is not None and len(d.blocks) >= min_blocks:
            return d
    tried = ", ".join(r.name for r in recs)
    raise DiscoveryError(f"{err} (recognisers tried: {tried})" if tried else str(err)) from None


def discover_with_progress(mg: ModelGraph, progress: Progress = silent) -> Discovery:
    """:func:`discover`, saying so on ``progress`` (what the partition flow shows while it finds blocks)."""
    progress("discovering blocks")
    disc = discover(mg)
    progress(f"found {len(disc.blocks)} blocks by {disc.method}: {disc.describe_regions()}")
    return disc


def _consult(r: Recognizer, mg: ModelGraph, skipped: list[str]) -> Discovery | None:
    try:
        d = r.recognize(mg)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin bug must not stop discovery: skip it, say so
        skipped.append(f"recogniser {r.name!r} raised {describe_exception(e)}; skipped")
        return None
    if d is None:
        return None
    if not isinstance(d, Discovery):
        skipped.append(f"recogniser {r.name!r} returned {type(d).__name__}, not a Discovery; skipped")
        return None
    check_discovery(mg, d, f"recogniser {r.name!r}")
    return d


__all__ = ["BUILTIN", "Recognizer", "ScopeRecognizer", "check_discovery", "discover", "discover_with_progress",
           "discovery_from_blocks",
           "installed", "plugins", "relabel", "structural"]
