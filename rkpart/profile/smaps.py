"""Parse ``/proc/PID/smaps``, ``/proc/PID/smaps_rollup`` and ``/proc/meminfo``.

The profiler reads memory the way the write-up did on the board: the process's proportional
set size (PSS) from ``smaps_rollup``, and the *device-mapped* PSS, i.e. the sum of ``Pss``
over the mappings of the NPU device.  On RK3588 the RKNPU driver is a DRM driver: the
runtime allocates GEM buffers with an ioctl and maps them by ``mmap`` on the DRM render
node, so they appear in ``smaps`` under the render node's path (``/dev/dri/renderD129``
next to the Mali GPU's ``renderD128``, or ``renderD128`` when no GPU driver is loaded);
buffers shared as dma-bufs appear as ``/dmabuf:<name>`` (kernel >= 5.x names them so) or,
on older kernels, ``anon_inode:dmabuf``; the old misc-device driver used ``/dev/rknpu``.
:data:`DEFAULT_DEVICE_PATTERN` covers all of these; ``--device-pattern`` overrides it.

Parsing is kept apart from reading so that recorded text from a board can be tested here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Pathnames of RKNPU mappings: DRM render nodes, dma-buf files, the legacy misc device and
#: dma-heap buffers.  Matched with ``re.search`` against the smaps pathname.
DEFAULT_DEVICE_PATTERN = (
    r"^(?:/dev/dri/renderD\d+|/dev/rknpu\S*|/dmabuf:.*|anon_inode:dmabuf|/dev/dma_heap/\S+)"
)

_HEADER = re.compile(
    r"^(?P<start>[0-9a-fA-F]+)-(?P<end>[0-9a-fA-F]+)\s+(?P<perms>\S{4})\s+(?P<offset>[0-9a-fA-F]+)\s+"
    r"(?P<dev>[0-9a-fA-F]+:[0-9a-fA-F]+)\s+(?P<inode>\d+)(?:\s+(?P<path>.*))?$"
)
_KB_FIELD = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*):\s+(?P<value>\d+)\s+kB\s*$")
_INT_FIELD = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*):\s+(?P<value>-?\d+)\s*$")


@dataclass(frozen=True)
class SmapsMapping:
    """One mapping of ``/proc/PID/smaps`` (or the single ``[rollup]`` entry of smaps_rollup).

    ``fields`` holds every ``Key: N kB`` line in KiB (``Rss``, ``Pss``, ``Swap``, ...);
    ``counters`` holds unit-less integer lines (``THPeligible``, ``ProtectionKey``).
    """

    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    pathname: str
    fields: Mapping[str, int] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)
    vmflags: tuple[str, ...] = ()

    @property
    def size_kib(self) -> int:
        return self.fields.get("Size", (self.end - self.start) // 1024)

    @property
    def rss_kib(self) -> int:
        return self.fields.get("Rss", 0)

    @property
    def pss_kib(self) -> int:
        return self.fields.get("Pss", 0)

    @property
    def swap_kib(self) -> int:
        return self.fields.get("Swap", 0)


class SmapsParseError(ValueError):
    """The text is not smaps (a line that is neither a mapping header nor a field)."""


def parse_smaps(text: str) -> list[SmapsMapping]:
    """Parse the text of ``/proc/PID/smaps`` or ``/proc/PID/smaps_rollup``.

    Parameters
    ----------
    text
        The file's content.  Field lines before the first header are an error; unknown
        field lines after a header are kept (kB fields in ``fields``, integers in
        ``counters``) so that newer kernels' additions do not break parsing.

    Returns
    -------
    list[SmapsMapping]
        In file order.  smaps_rollup gives one mapping whose pathname is ``[rollup]``.

    Raises
    ------
    SmapsParseError
        On a line that fits neither form.

    Examples
    --------
    >>> m = parse_smaps("7f00-8f00 rw-s 00000000 00:05 12  /dev/dri/renderD129\\nPss: 4 kB\\n")
    >>> m[0].pathname, m[0].pss_kib
    ('/dev/dri/renderD129', 4)
    """
    out: list[SmapsMapping] = []
    cur: dict[str, object] | None = None
    fields: dict[str, int] = {}
    counters: dict[str, int] = {}
    vmflags: tuple[str, ...] = ()

    def flush() -> None:
        if cur is not None:
            out.append(
                SmapsMapping(
                    fields=dict(fields), counters=dict(counters), vmflags=vmflags, **cur  # type: ignore[arg-type]
                )
            )

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        m = _HEADER.match(line)
        if m:
            flush()
            cur = {
                "start": int(m["start"], 16),
                "end": int(m["end"], 16),
                "perms": m["perms"],
                "offset": int(m["offset"], 16),
                "dev": m["dev"],
                "inode": int(m["inode"]),
                "pathname": (m["path"] or "").strip(),
            }
            fields, counters, vmflags = {}, {}, ()
            continue
        if cur is None:
            raise SmapsParseError(f"line {lineno}: field before any mapping header: {line[:60]!r}")
        if line.startswith("VmFlags:"):
            vmflags = tuple(line.split(":", 1)[1].split())
            continue
        k = _KB_FIELD.match(line)
        if k:
            fields[k["key"]] = int(k["value"])
            continue
        c = _INT_FIELD.match(line)
        if c:
            counters[c["key"]] = int(c["value"])
            continue
        raise SmapsParseError(f"line {lineno}: not an smaps line: {line[:60]!r}")
    flush()
    return out


def compile_pattern(pattern: str | re.Pattern[str] | None) -> re.Pattern[str]:
    """Compile a device pattern (``None`` means :data:`DEFAULT_DEVICE_PATTERN`)."""
    if pattern is None:
        return re.compile(DEFAULT_DEVICE_PATTERN)
    if isinstance(pattern, re.Pattern):
        return pattern
    return re.compile(pattern)


def device_mappings(
    mappings: Iterable[SmapsMapping], pattern: str | re.Pattern[str] | None = None
) -> list[SmapsMapping]:
    """The mappings whose pathname matches ``pattern`` (``re.search``)."""
    rx = compile_pattern(pattern)
    return [m for m in mappings if m.pathname and rx.search(m.pathname)]


def device_pss_kib(mappings: Iterable[SmapsMapping], pattern: str | re.Pattern[str] | None = None) -> int:
    """Sum of ``Pss`` (KiB) over the mappings whose pathname matches ``pattern``."""
    return sum(m.pss_kib for m in device_mappings(mappings, pattern))


def total_kib(mappings: Iterable[SmapsMapping], key: str) -> int:
    """Sum of one kB field (``"Pss"``, ``"Rss"``, ``"Swap"``, ...) over ``mappings``."""
    return sum(m.fields.get(key, 0) for m in mappings)


@dataclass(frozen=True)
class SmapsTotals:
    """Process totals and device PSS of one smaps text, in KiB."""

    pss_kib: int
    rss_kib: int
    swap_kib: int
    device_pss_kib: int


_HEX_START = frozenset("0123456789abcdef")


def summarize_smaps(text: str, pattern: str | re.Pattern[str] | None = None) -> SmapsTotals:
    """Totals of ``Pss``/``Rss``/``Swap`` and the device PSS of an smaps text, quickly.

    Gives the same numbers as :func:`parse_smaps` followed by :func:`total_kib` and
    :func:`device_pss_kib` (a test holds it to that) at about a fifth of the cost, because
    the sampler runs it many times per second while the profiled stages run: it looks only
    at mapping headers (which start with a lower-case hex digit; field names start with an
    upper-case letter) and at the three fields it needs.
    """
    rx = compile_pattern(pattern)
    pss = rss = swap = dev = 0
    is_dev = False
    for line in text.splitlines():
        c = line[:1]
        if c == "P":
            if line.startswith("Pss:"):
                v = int(line[4:].split()[0])
                pss += v
                if is_dev:
                    dev += v
        elif c == "R":
            if line.startswith("Rss:"):
                rss += int(line[4:].split()[0])
        elif c == "S":
            if line.startswith("Swap:"):
                swap += int(line[5:].split()[0])
        elif c in _HEX_START:
            parts = line.split(None, 5)
            is_dev = len(parts) == 6 and rx.search(parts[5].strip()) is not None
    return SmapsTotals(pss, rss, swap, dev)


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse ``/proc/meminfo``: ``{"MemTotal": kib, "SwapFree": kib, ...}``.

    Lines without a ``kB`` unit (``HugePages_Total: 0``) are kept as plain integers.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def swap_used_kib(meminfo: Mapping[str, int]) -> int:
    """``SwapTotal - SwapFree`` in KiB (0 on a machine without swap)."""
    return max(0, int(meminfo.get("SwapTotal", 0)) - int(meminfo.get("SwapFree", 0)))


# -- readers -------------------------------------------------------------------------------
def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def read_smaps(pid: int | None = None) -> list[SmapsMapping]:
    """Parse ``/proc/PID/smaps`` of ``pid`` (default: this process)."""
    return parse_smaps(_read(f"/proc/{pid or os.getpid()}/smaps"))


def read_smaps_totals(pid: int | None = None, pattern: str | re.Pattern[str] | None = None) -> SmapsTotals:
    """:func:`summarize_smaps` of ``/proc/PID/smaps``."""
    return summarize_smaps(_read(f"/proc/{pid or os.getpid()}/smaps"), pattern)


def read_rollup_kib(pid: int | None = None) -> dict[str, int]:
    """Totals of ``/proc/PID/smaps_rollup`` (kernel >= 4.14) in KiB.

    Falls back to summing ``smaps`` when the rollup file does not exist, which is slower
    but gives the same numbers.
    """
    pid = pid or os.getpid()
    try:
        maps = parse_smaps(_read(f"/proc/{pid}/smaps_rollup"))
    except FileNotFoundError:
        maps = read_smaps(pid)
    keys = sorted({k for m in maps for k in m.fields})
    return {k: total_kib(maps, k) for k in keys}


def read_meminfo() -> dict[str, int]:
    """Parse ``/proc/meminfo``."""
    return parse_meminfo(_read("/proc/meminfo"))
