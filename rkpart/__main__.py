"""The ``rkpart`` command (console script and ``python -m rkpart``): :mod:`rkpart.cli` behind a guard
that makes Ctrl-C one line and exit 130 at any moment, start-up included (issue 51).

The guard comes first: importing the commands takes a second or more (click, NumPy, ONNX), and a
SIGINT then used to print a traceback from the middle of an import.  Click's own main turns a
Ctrl-C while it parses into "Aborted!" and exit 1; here it is run in non-standalone mode so every
way out is rkpart's: an error's own line and code, ``rkpart: interrupted`` and 130.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

#: exit status of an interrupted run (rkpart.errors.INTERRUPTED_EXIT; not imported: the guard must
#: not depend on anything that could itself be interrupted while it loads)
_INTERRUPTED = 130


def interrupted() -> NoReturn:
    """Print ``rkpart: interrupted`` and exit 130, ignoring further Ctrl-C meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this prints is no traceback either
    try:
        sys.stderr.write("rkpart: interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    raise SystemExit(_INTERRUPTED)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run ``rkpart ARGV`` (default: ``sys.argv[1:]``) and exit with its code."""
    try:
        import click

        from rkpart.cli import main as group

        try:
            code = group.main(args=argv, prog_name="rkpart", standalone_mode=False)
        except click.exceptions.Abort:  # click's name for a KeyboardInterrupt (or EOF) while it parsed
            interrupted()
        except click.ClickException as e:
            e.show()
            raise SystemExit(e.exit_code) from None
        except click.exceptions.Exit as e:
            raise SystemExit(e.exit_code) from None
        raise SystemExit(code if isinstance(code, int) else 0)
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    main()
