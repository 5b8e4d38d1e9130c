"""smaps / meminfo parsing on recorded (x86) and synthesised (RK3588) text."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from rkpart.profile import smaps
from tests.profile.conftest import fixture_text

RK = "smaps_rk3588_rknnlite_synthesised.txt"
LEGACY = "smaps_rknpu_legacy_synthesised.txt"
X86 = "smaps_x86_ort_recorded.txt"


def test_rk3588_device_pss_is_sum_of_render_node_and_dmabuf_mappings() -> None:
    maps = smaps.parse_smaps(fixture_text(RK))
    dev = smaps.device_mappings(maps)
    assert [m.pathname for m in dev] == ["/dev/dri/renderD129"] * 3 + ["/dmabuf:"]
    assert smaps.device_pss_kib(maps) == 102400 + 20480 + 4096 + 168 == 127144
    # librknnrt.so and the rknnlite extension are host memory, not device memory.
    assert all("librknnrt" not in m.pathname for m in dev)


def test_mapping_fields_header_and_vmflags_are_parsed() -> None:
    maps = smaps.parse_smaps(fixture_text(RK))
    weights = maps[5]
    assert weights.pathname == "/dev/dri/renderD129"
    assert (weights.start, weights.end) == (0xFFFF7F000000, 0xFFFF85400000)
    assert weights.perms == "rw-s"
    assert weights.offset == 0x100000000
    assert weights.size_kib == 102400 and weights.rss_kib == 102400 and weights.pss_kib == 102400
    assert {"io", "dc", "de", "dd"} <= set(weights.vmflags)
    assert weights.counters == {"THPeligible": 0}
    anon = maps[4]
    assert anon.pathname == "" and anon.fields["Anonymous"] == 49152


def test_custom_pattern_selects_only_the_npu_render_node() -> None:
    maps = smaps.parse_smaps(fixture_text(RK))
    assert smaps.device_pss_kib(maps, r"renderD129$") == 127144 - 168
    assert smaps.device_pss_kib(maps, re.compile(r"^/dmabuf:")) == 168
    assert smaps.device_pss_kib(maps, r"nothing-matches") == 0


def test_legacy_misc_device_and_anon_inode_dmabuf_count_but_card0_does_not() -> None:
    maps = smaps.parse_smaps(fixture_text(LEGACY))
    assert "Pss_Dirty" not in maps[0].fields  # 5.10 field set
    assert [m.pathname for m in smaps.device_mappings(maps)] == ["/dev/rknpu", "anon_inode:dmabuf"]
    assert smaps.device_pss_kib(maps) == 8192 + 1024
    assert smaps.total_kib(maps, "Swap") == 900


@pytest.mark.parametrize("name", [RK, LEGACY, X86])
def test_fast_summary_equals_full_parse(name: str) -> None:
    text = fixture_text(name)
    maps = smaps.parse_smaps(text)
    tot = smaps.summarize_smaps(text)
    assert tot.pss_kib == smaps.total_kib(maps, "Pss")
    assert tot.rss_kib == smaps.total_kib(maps, "Rss")
    assert tot.swap_kib == smaps.total_kib(maps, "Swap")
    assert tot.device_pss_kib == smaps.device_pss_kib(maps)


def test_recorded_x86_smaps_has_no_device_memory_and_pathnames_with_paths() -> None:
    maps = smaps.parse_smaps(fixture_text(X86))
    assert len(maps) == 92
    assert smaps.device_pss_kib(maps) == 0
    assert any(m.pathname == "[heap]" for m in maps)
    assert any(m.pathname.endswith("onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so") for m in maps)
    assert smaps.total_kib(maps, "Pss") > 0


def test_recorded_rollup_parses_to_one_mapping() -> None:
    maps = smaps.parse_smaps(fixture_text("smaps_rollup_x86_recorded.txt"))
    assert len(maps) == 1 and maps[0].pathname == "[rollup]"
    assert maps[0].pss_kib == 38657 and maps[0].rss_kib == 47040


def test_meminfo_swap() -> None:
    board = smaps.parse_meminfo(fixture_text("smaps_meminfo_rk3588_synthesised.txt"))
    assert board["SwapTotal"] == 4194300 and board["HugePages_Total"] == 0
    assert smaps.swap_used_kib(board) == 4194300 - 4182012
    here = smaps.parse_meminfo(fixture_text("smaps_meminfo_x86_recorded.txt"))
    assert smaps.swap_used_kib(here) == 0  # this machine has no swap


def test_garbage_is_rejected_with_the_line_number() -> None:
    with pytest.raises(smaps.SmapsParseError, match="line 1"):
        smaps.parse_smaps("Pss: 4 kB\n")
    with pytest.raises(smaps.SmapsParseError, match="line 2"):
        smaps.parse_smaps("7f00-8f00 rw-p 00000000 00:00 0\nnot smaps at all\n")


def test_live_smaps_of_this_process_sees_a_fresh_allocation() -> None:
    before = smaps.read_smaps_totals()
    block = np.ones(48 * 2**20 // 8)  # 48 MiB, every page written
    after = smaps.read_smaps_totals()
    assert after.pss_kib - before.pss_kib >= 40 * 1024
    roll = smaps.read_rollup_kib(os.getpid())
    assert roll["Pss"] >= 48 * 1024
    del block
