"""Shared option groups (rkpart.cli_args): parsed once, the same on every command."""

from __future__ import annotations

from typing import Any

import click
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.cli_args import build_options, shape_option


def _params(cmd: click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, click.Parameter]]:
    if isinstance(cmd, click.Group):
        return [p for name, sub in cmd.commands.items() for p in _params(sub, (*prefix, name))]
    return [(" ".join(prefix), p) for p in cmd.params]


def test_shared_options_read_the_same_on_every_command() -> None:
    seen: dict[str, set[tuple[tuple[str, ...], str | None]]] = {}
    for _cmd, p in _params(main):
        if isinstance(p, click.Option) and p.name in ("quiet", "seed", "toolkits_dir", "shapes", "opt_level",
                                                       "config", "single_core", "target", "residency"):
            seen.setdefault(str(p.name), set()).add((tuple(p.opts), str(p.type)))
    # each shared option is spelled and parsed one way wherever it appears
    assert {k for k, v in seen.items() if len(v) != 1} == set(), seen
    assert {"quiet", "seed", "toolkits_dir", "shapes", "opt_level", "config", "target", "residency"} <= set(seen)


def test_build_options_merge_into_one_rknn_config() -> None:
    got: dict[str, Any] = {}

    @click.command()
    @build_options
    @shape_option
    def cmd(target: str, rknn_config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> None:
        got.update(target=target, config=rknn_config, shapes=shapes)

    r = CliRunner().invoke(cmd, ["--config", "optimization_level=1", "--config", "op_target={\"a\": \"cpu\"}",
                                 "--opt-level", "2", "--single-core", "--shape", "x=1,3,8"])
    assert r.exit_code == 0, r.output
    assert got == {"target": "rk3588", "shapes": {"x": (1, 3, 8)},
                   "config": {"optimization_level": 2, "op_target": {"a": "cpu"}, "single_core_mode": True}}
    bad = CliRunner().invoke(cmd, ["--shape", "x=1,0"])
    assert bad.exit_code == 2 and "positive integers" in bad.output
