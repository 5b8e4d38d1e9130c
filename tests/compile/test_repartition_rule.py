"""The keep/undo rule of ``rkpart compile --repartition`` (:func:`rkpart.repartition.judge_round`), on figures.

The toolkit builds of the loop itself are in ``test_repartition.py``; here the decision alone, on
the figures of the plans the issue measured (issue 50, the head-dim-88 family).
"""

from __future__ import annotations

import dataclasses

from rkpart.repartition import PlanFigures, RepartitionRound, judge_round

#: the head-dim-88 family's split plan after its first build: 6 NPU stages, all the block matmul work on
#: them, 4 CPU layers (head Reshapes / Transposes of 1024 tokens x 1152 in float32)
FIRST = PlanFigures(failed=0, cpu_layers=4, cpu_layer_bytes=4 * 2 * 1024 * 1152 * 4, npu_macs=10_000_000_000,
                    block_macs=10_000_000_000, npu_stages=6, npu_io_bytes=6 * 3 * 1024 * 1152 * 4)


def test_a_round_that_removes_no_cpu_layer_is_undone() -> None:
    """Rounds 3-4 of the measured run: every Softmax and attention-value product moved to the host, no CPU
    layer removed (14 NPU stages, 94.4 % of the work on the NPU, 4 CPU layers left): undone."""
    worse = dataclasses.replace(FIRST, npu_macs=9_440_000_000, npu_stages=14,
                                npu_io_bytes=FIRST.npu_io_bytes * 14 // 6)
    why = judge_round(FIRST, worse)
    assert why is not None and "did not reduce the CPU layers (4 -> 4; NPU stages 6 -> 14)" in why
    # nor is a round that leaves as many with fewer stages: the rule is about CPU layers first
    assert judge_round(FIRST, dataclasses.replace(FIRST, npu_stages=5)) is not None


def test_a_round_that_costs_more_on_the_npu_than_it_saves_is_undone() -> None:
    """One CPU layer fewer, bought with the attention's matmul work on the host: undone, with the figures."""
    dearer = dataclasses.replace(FIRST, cpu_layers=3, cpu_layer_bytes=FIRST.cpu_layer_bytes * 3 // 4,
                                 npu_macs=9_440_000_000, npu_stages=10)
    assert dearer.seconds() > FIRST.seconds()
    why = judge_round(FIRST, dearer)
    assert why is not None and "costs more than it saves" in why and "100.0% -> 94.4%" in why


def test_a_round_that_removes_cpu_layers_cheaply_is_kept() -> None:
    """The head Transposes moved to the host, each one boundary more: every CPU layer gone, kept."""
    cheap = dataclasses.replace(FIRST, cpu_layers=0, cpu_layer_bytes=0, npu_stages=10,
                                npu_io_bytes=FIRST.npu_io_bytes + 4 * 2 * 1024 * 1152 * 4)
    assert judge_round(FIRST, cheap) is None


def test_failed_stages_come_first() -> None:
    failing = dataclasses.replace(FIRST, failed=1)
    # a round that fixes a failed build is kept even with a CPU layer more
    assert judge_round(failing, dataclasses.replace(FIRST, cpu_layers=5)) is None
    # one that fails a build that built is undone, whatever it saved
    assert judge_round(FIRST, dataclasses.replace(failing, cpu_layers=0)) == "failed stages 0 -> 1"
    # a round still working on a failure is kept (the best such round is kept at the end of the loop)
    assert judge_round(failing, failing) is None


def test_an_undone_round_says_why() -> None:
    r = RepartitionRound(3, ("Softmax_1",), 4, 4, 8, undone="it did not reduce the CPU layers (4 -> 4)")
    assert r.describe().endswith("; 8 stage(s) rebuilt; undone: it did not reduce the CPU layers (4 -> 4)")
