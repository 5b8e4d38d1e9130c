"""Click's own usage errors are one line and exit 2 on every command (issue 31: "every error path
gives one line and the exit code listed in docs/errors.md").

Click prints a usage error as three lines (usage, a "Try ... for help" hint, "Error: ...").  The
cases are generated from the commands themselves: an unknown option on every command, and a
value of the wrong type, out of range or not among the choices for every option that takes one,
so a command or option added later is covered without a new case here.
"""

from __future__ import annotations

import click
import pytest

from rkpart.cli import main
from rkpart.cli_args import FiniteFloat
from tests.hostile.models import FUZZ_STATS, assert_user_error, cli


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name in sorted(group.commands):
        cmd = group.commands[name]
        out.append(((*path, name), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*path, name))
    return out


COMMANDS = _commands(main)


def _bad_values(opt: click.Option) -> list[str]:
    """Values ``opt``'s own type refuses (none for flags, paths and free text)."""
    t = opt.type
    if opt.is_flag or opt.count:
        return []
    if isinstance(t, click.Choice):
        return ["no-such-choice"]
    if isinstance(t, click.IntRange):
        bad = ["x", "1.5"]
        if t.min is not None:
            bad.append(str(t.min - 1))
        if t.max is not None:
            bad.append(str(t.max + 1))
        return bad
    if isinstance(t, click.FloatRange):
        bad = ["x", "nan", "inf"] if isinstance(t, FiniteFloat) else ["x"]
        if t.min is not None:
            bad.append(repr(float(t.min) - 1.0))
        if t.max is not None:
            bad.append(repr(float(t.max) + 1.0))
        return bad
    if t in (click.INT, click.FLOAT):
        return ["x"]
    return []


BAD_VALUES = [
    (path, opt.opts[0], value)
    for path, cmd in COMMANDS if not isinstance(cmd, click.Group)
    for opt in cmd.params if isinstance(opt, click.Option)
    for value in _bad_values(opt)
]


def test_the_cases_cover_every_command_and_many_options() -> None:
    leaves = {p for p, c in COMMANDS if not isinstance(c, click.Group)}
    assert len(leaves) >= 18 and {"partition", "compile", "bundle", "report", "calibrate"} <= {p[-1] for p in leaves}
    assert len({(p, o) for p, o, _ in BAD_VALUES}) >= 60, "options with a typed value"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_an_unknown_option_is_one_line_naming_it_and_the_help(path: tuple[str, ...]) -> None:
    r = cli([*path, "--no-such-option-x"])
    assert_user_error(r, 2, "no such option", "--no-such-option-x", f"see 'main {' '.join(path)} -h'")
    FUZZ_STATS["cases:usage"] += 1


def test_an_unknown_command_is_one_line() -> None:
    assert_user_error(cli(["no-such-command"]), 2, "no such command", "'no-such-command'", "see 'main -h'")
    assert_user_error(cli(["cache", "no-such-command"]), 2, "no such command", "see 'main cache -h'")
    assert_user_error(cli(["--no-such-option-x"]), 2, "no such option", "see 'main -h'")


def test_a_group_without_a_command_still_shows_its_help() -> None:
    r = cli(["cache"])  # help, not an error line: the user asked for nothing
    assert r.exit_code in (0, 2) and "Commands:" in r.output and "info" in r.output


@pytest.mark.parametrize(("path", "option", "value"), BAD_VALUES,
                         ids=[f"{' '.join(p)} {o}={v}" for p, o, v in BAD_VALUES])
def test_a_value_the_option_refuses_is_one_line_naming_the_option(path: tuple[str, ...], option: str,
                                                                   value: str) -> None:
    r = cli([*path, option, value])
    assert_user_error(r, 2, option)
    FUZZ_STATS["cases:usage"] += 1


RUNNER_USAGE = [["--bogus"], ["--passes", "x"], ["--steps", "1.5"], ["--seed", "x"], ["--residency", "nope"],
                ["--core-mask", "9"], ["--scheduler", "ddim"], ["--guidance"]]


@pytest.mark.parametrize("argv", RUNNER_USAGE, ids=" ".join)
def test_the_board_runners_usage_errors_are_one_line_exit_2(argv: list[str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """docs/board.md: every runner error is one line and exit 2; argparse alone prints two."""
    from rkpart.runtime.board_runner import main as runner_main

    with pytest.raises(SystemExit) as e:
        runner_main(argv)
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("runner: error: ") and err[0].endswith("(see 'runner.py -h')"), err
    FUZZ_STATS["cases:usage"] += 1


def test_skip_rewrite_without_the_rewrites_is_one_line(tmp_path: object) -> None:
    r = cli(["compile", tmp_path, "--toolkit", "2.5.0", "--no-rewrites", "--skip-rewrite", "nan-guard"])
    assert_user_error(r, 2, "--skip-rewrite", "--no-rewrites")
