"""The command line's shape: every command lives in :mod:`rkpart.commands`, and ``--help`` reads
as recorded.

``tests/data/cli_help.json`` holds ``rkpart --help`` and every subcommand's ``--help`` (width
100); a change to an option or a docstring changes it, deliberately::

    PYTHONPATH=. python -m tests.test_cli_help      # rewrites tests/data/cli_help.json
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rkpart.cli import main

# outside the fast tier: every command's help in a fresh process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

RECORD = Path(__file__).parent / "data" / "cli_help.json"
ROOT = Path(__file__).resolve().parents[1] / "rkpart"


def help_texts() -> dict[str, str]:
    """``"rkpart compile" -> its --help`` for the group and every command under it."""
    runner = CliRunner()
    out: dict[str, str] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        res = runner.invoke(main, [*path[1:], "--help"], prog_name="rkpart", terminal_width=100)
        assert res.exit_code == 0, res.output
        out[" ".join(path)] = res.output
        if isinstance(cmd, click.Group):
            for name in sorted(cmd.commands):
                walk(cmd.commands[name], [*path, name])

    walk(main, ["rkpart"])
    return out


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    # a fresh process: click caches a command's help option once built, so a test that invoked a
    # command outside the group (no ``-h``) earlier in this process would change its --help
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "tests.test_cli_help", "--print"], cwd=ROOT.parent, env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return dict(json.loads(out))


def test_every_command_is_recorded(texts: dict[str, str]) -> None:
    assert sorted(texts) == sorted(json.loads(RECORD.read_text()))


@pytest.mark.parametrize("command", sorted(json.loads(RECORD.read_text())))
def test_help_reads_as_recorded(command: str, texts: dict[str, str]) -> None:
    assert texts[command] == json.loads(RECORD.read_text())[command]


def _command_functions(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Attribute) and f.attr == "command":
                    names.append(node.name)
    return names


def test_commands_live_in_rkpart_commands_only() -> None:
    """``cli.py`` assembles the group; no other module outside ``rkpart/commands/`` defines a command."""
    outside = {p.relative_to(ROOT).as_posix(): _command_functions(p) for p in sorted(ROOT.rglob("*.py"))
               if "commands" not in p.relative_to(ROOT).parts}
    assert {k: v for k, v in outside.items() if v} == {}
    assert _command_functions(ROOT / "commands" / "run.py") == ["run"]  # the walk sees a command


def test_every_command_module_is_registered() -> None:
    registered = {c.callback.__module__ for c in main.commands.values() if c.callback is not None}
    registered |= {c.__module__ for c in main.commands.values() if isinstance(c, click.Group)}
    modules = {f"rkpart.commands.{p.stem}" for p in (ROOT / "commands").glob("*.py") if p.stem != "__init__"}
    assert modules <= registered | {m for m in modules if not _command_functions(ROOT / "commands" /
                                                                                  f"{m.rsplit('.', 1)[1]}.py")}


if __name__ == "__main__":
    if sys.argv[1:] == ["--print"]:
        print(json.dumps(help_texts()))
    else:
        RECORD.write_text(json.dumps(help_texts(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {RECORD}")
