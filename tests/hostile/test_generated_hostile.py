"""The generated hostile suite (issue 51): every file kind rkpart reads and every output flag, from
registries, never from a hand-written list of cases (:mod:`tests.hostile.generated`).

A new reader (a :class:`~rkpart.readers.FileKind`) is covered once a command of the world reads it
or :data:`~tests.hostile.generated.SAMPLES` can make one (checked below); a new output flag once its
type is :class:`~rkpart.cli_args.OutputFile` / ``OutputFolder`` (checked below: an option named like
an output must have one).  Here a sample of the cases runs (every kind and variant read directly, every (command, kind)
and every output flag once); ``python scripts/hostile_suite.py`` runs
all of them (more than 1000) and prints the counts and the CPU time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from tests.hostile import generated as G
from tests.hostile import world as W
from tests.hostile.models import FUZZ_STATS


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bundled: Path) -> tuple[Path, list[W.Route]]:
    return W.make_world(tmp_path_factory.mktemp("hostile-world"), bundled)


def _run(cases: list[G.Case], label: str) -> list[W.Outcome]:
    out = []
    for case in cases:
        o = G.run_case(case)
        out.append(o)
        FUZZ_STATS[f"cases:generated-{label}"] += 1
    broken = [f"{o.case}: {'; '.join(o.breaks)} (exit {o.exit_code}: {o.message[:160]})" for o in out if o.breaks]
    assert not broken, f"{len(broken)} of {len(out)} cases broke:\n" + "\n".join(broken[:30])
    return out


def _rotating(cases: list[G.Case], group: Callable[[str], str], per_group: int,
              always: Callable[[str], bool] = lambda _c: False) -> list[G.Case]:
    """A deterministic sample: of each group of cases (by ``group(id)``), those ``always`` keeps and
    ``per_group`` more, the i-th group starting at its i-th case, so the groups together cover
    different variants (the script runs every case)."""
    groups: dict[str, list[G.Case]] = {}
    for c in cases:
        groups.setdefault(group(c[0]), []).append(c)
    out: list[G.Case] = []
    for i, (_, cs) in enumerate(sorted(groups.items())):
        kept = [c for c in cs if always(c[0])]
        rest = [c for c in cs if not always(c[0])]
        out += kept + [rest[(i + j) % len(rest)] for j in range(min(per_group, len(rest)))]
    return out


@pytest.mark.slow  # builds the world: a plan, a calibration, a profile, a cost model, a bundle (~10 s of CPU)
def test_every_registered_kind_is_traced_or_made(world: tuple[Path, list[W.Route]]) -> None:
    from tests.hostile.test_errors_doc import all_kinds

    kinds = set(all_kinds())
    traced = {k for r in world[1] for k in r.reads}
    missing = sorted(kinds - traced - set(G.SAMPLES))
    assert not missing, f"no command of the world reads {missing} and tests.hostile.generated.SAMPLES makes none"
    assert len(traced) >= 12, traced


@pytest.mark.slow
def test_every_reader_holds_on_every_variant(world: tuple[Path, list[W.Route]]) -> None:
    """Every kind, every variant, one of its numbers given NaN / Inf / 0 / -1 / 1e308, read directly
    (~2 s of CPU; the script: every number)."""
    cases = list(G.reader_cases(*world, numbers=1))
    assert len(cases) >= 400
    _run(cases, "readers")


@pytest.mark.slow
def test_every_command_holds_when_a_file_it_reads_is_hostile(world: tuple[Path, list[W.Route]]) -> None:
    """Every (command, kind it reads) once, the variant rotating (each case copies the world and runs
    the command: ~0.2 s of CPU; the script runs all of them)."""
    cases = _rotating(list(G.cli_cases(*world, numbers=0)), lambda c: c.rsplit(" ", 1)[0], 1)
    assert len(cases) >= 15
    _run(cases, "commands")


@pytest.mark.slow
def test_no_command_follows_a_name_out_of_its_folder(world: tuple[Path, list[W.Route]]) -> None:
    """Every kind of file that names other files (a plan's stage files, a calibration's datasets and
    samples, a profile's stage, a run report's model...) once, through a rotating command, with one of
    its names pointed at a valid copy outside its folder (``../`` or absolute), a FIFO or /dev/zero:
    never opened (an audit hook sees every open of the process), never a hang.  With the readers'
    containment checks removed, 10 of the 20 calibration cases break."""
    path_variants = ("=up-copy", "=abs-copy", "=abs-fifo", "=abs-devzero")
    pool = [c for c in G.cli_cases(*world, numbers=1) if c[0].endswith(path_variants)]
    cases = _rotating(pool, lambda c: c.split(" <- ", 1)[1].rsplit(" ", 1)[0], 1)  # by kind
    assert len(cases) >= 6, sorted({c[0] for c in cases})
    _run(cases, "paths")


@pytest.mark.slow
def test_every_output_flag_holds(world: tuple[Path, list[W.Route]]) -> None:
    """Every output flag given one of its inputs and one more destination, rotating; the runner's
    flags three each (the script: every destination)."""
    cases = [*_rotating(list(G.output_cases(world[0], full=False)), lambda c: c.rsplit(" ", 1)[0], 1,
                        always=lambda c: c.endswith(" input")),
             *_rotating(list(G.runner_output_cases(world[0])), lambda c: c.rsplit(" ", 1)[0], 3)]
    assert len(cases) >= 25
    _run(cases, "outputs")


# -- the registries themselves ----------------------------------------------------------------------------

#: option names that say "this is written": each such option must be an OutputFile / OutputFolder
_OUTPUT_NAME = re.compile(r"^(-o|--out|--output|--save-.*|--.*-out)$")


def _commands() -> list[tuple[str, click.Command]]:
    from rkpart.cli import main

    out = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in sorted(group.commands):
            cmd = group.commands[name]
            if isinstance(cmd, click.Group):
                walk(cmd, (*path, name))
            else:
                out.append((" ".join((*path, name)), cmd))

    walk(main, ())
    return out


def test_every_output_flag_is_typed_and_has_a_base() -> None:
    from rkpart.cli_args import OutputFile, OutputFolder

    untyped = [f"{c} {o}" for c, cmd in _commands() for p in cmd.params for o in p.opts
               if _OUTPUT_NAME.match(o) and not isinstance(p.type, (OutputFile, OutputFolder))]
    assert not untyped, f"output options without an OutputFile/OutputFolder type: {untyped}"
    flags = G.output_params()
    assert {c for c, _ in flags} >= {"fit", "profile", "drift", "report", "run", "example", "partition", "bundle",
                                     "calibrate", "tune", "repro"}
    assert not {c for c, _ in flags} - set(G.BASES), "an output flag with no base command line in generated.BASES"
    assert all(p.opts[0] != "--accuracy" for c, p in flags if c == "partition")  # partition's --accuracy is an input


def test_the_runners_output_flags_go_through_one_check(runner_mod: object) -> None:
    """Every output flag of the bundle runner is in its ``OUTPUT_FLAGS`` (checked by ``check_save_target``)."""
    flags = runner_mod.OUTPUT_FLAGS
    src = Path(str(runner_mod.__file__)).read_text()
    seen = {m.group(1) for m in re.finditer(r'add_argument\("(--[a-z-]+)"', src)}
    assert {f for f in seen if _OUTPUT_NAME.match(f)} == set(flags)
