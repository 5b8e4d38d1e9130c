"""Command line: the ``rkpart`` group, assembled from the commands of :mod:`rkpart.commands`.

Options become typed values in callbacks (``click.BadParameter`` on bad input); commands
call one library function; the group turns :class:`rkpart.errors.UserError` into one line
on stderr and the error's exit code; click's own usage errors (unknown option, a value out of
range) become one line too, with the command's help hint, exit 2.  Internal errors keep their
traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from rkpart import __version__
from rkpart.cli_args import report_user_error
from rkpart.errors import INTERRUPTED_EXIT, RkpartError, UserError, one_line, os_error

#: click's "no arguments: show the help" error (click >= 8.2) is help, not an error line
_NO_ARGS_IS_HELP: tuple[type[BaseException], ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None)


class OneLineClickError(click.ClickException):
    """A click error shown the way rkpart shows every error: one ``rkpart: error:`` line.

    Click prints a usage error as three lines (usage, a hint, the error); docs/errors.md
    promises one line and exit 2 for every usage error.
    """

    def __init__(self, e: click.ClickException, ctx: click.Context | None = None) -> None:
        msg = " ".join(e.format_message().split())  # a multi-line message (a BadParameter's) joined
        ectx = getattr(e, "ctx", None) or ctx
        if isinstance(e, click.UsageError) and ectx is not None:
            msg += f" (see '{ectx.command_path} {ectx.help_option_names[0]}')" if ectx.help_option_names else ""
        super().__init__(msg)
        self.__dict__["exit_code"] = e.exit_code  # the wrapped error's code (click types it a ClassVar)

    def show(self, file: Any = None) -> None:
        click.echo(f"rkpart: error: {one_line(self.message)}", err=True)


def _one_line(e: click.ClickException, ctx: click.Context | None = None) -> click.ClickException:
    if isinstance(e, (OneLineClickError, *_NO_ARGS_IS_HELP)):
        return e
    return OneLineClickError(e, ctx)


class RkpartGroup(click.Group):
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:  # the group's own options: `rkpart --bogus`
            raise _one_line(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as e:  # a command's options and arguments, and its UsageErrors
            raise _one_line(e, ctx) from None
        except UserError as e:
            report_user_error(e)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("rkpart: interrupted", err=True)
            ctx.exit(INTERRUPTED_EXIT)
        except BrokenPipeError:
            ctx.exit(0)
        except OSError as e:
            err = os_error(e, "rkpart")
            if err is None:
                raise
            report_user_error(err)
            ctx.exit(err.exit_code)
        except MemoryError:
            click.echo("rkpart: error: out of memory", err=True)
            ctx.exit(71)
        except RkpartError as e:
            click.echo(f"rkpart: internal error: {e}", err=True)
            raise


@click.group(cls=RkpartGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rkpart")
def main() -> None:
    """Partition Diffusion Transformer ONNX graphs for Rockchip NPUs (RK3588).

    \b
    Typical flow:
      rkpart inspect MODEL.onnx                       # blocks and regions found
      rkpart partition MODEL.onnx --strategy split --out build/
      rkpart run build/                               # ONNX Runtime vs the whole model
      rkpart compile build/ --toolkit 2.3.0 --target rk3588
      rkpart run build/ --backend rknn-sim --toolkit 2.3.0
    """


def _register() -> None:
    """Every command: the modules of :mod:`rkpart.commands`."""
    import importlib

    for mod, names in (
        ("rkpart.commands.partition", ("partition",)),
        ("rkpart.commands.inspect", ("inspect",)),
        ("rkpart.commands.run", ("run",)),
        ("rkpart.commands.strategies", ("strategies",)),
        ("rkpart.commands.example", ("example",)),
        ("rkpart.commands.compile", ("toolkit", "compile_cmd", "cache")),
        ("rkpart.commands.profile", ("profile",)),
        ("rkpart.commands.fit", ("fit",)),
        ("rkpart.commands.tune", ("tune",)),
        ("rkpart.commands.repro", ("repro",)),
        ("rkpart.commands.recognizers", ("recognizers",)),
        ("rkpart.commands.bundle", ("bundle",)),
        ("rkpart.commands.report", ("report",)),
        ("rkpart.commands.drift", ("drift",)),
        ("rkpart.commands.estimate", ("estimate",)),
        ("rkpart.commands.calibrate", ("calibrate",)),
        ("rkpart.commands.export", ("export",)),
        ("rkpart.commands.encode", ("encode",)),
    ):
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        for n in names:
            cmd = getattr(module, n, None)
            if isinstance(cmd, click.Command):
                main.add_command(cmd)


_register()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
