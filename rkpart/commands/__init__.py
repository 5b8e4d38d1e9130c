"""Every ``rkpart`` subcommand, one module per command or command family.

They sit in the CLI layer (above every library package) so that a command may use any
library package: ``profile --against`` reads a cost model, ``compile`` resolves toolkits.
Each module parses options with the shared groups of :mod:`rkpart.cli_args` into one frozen
options object, calls one library function, prints, and picks the exit code.
:mod:`rkpart.cli` only assembles them into the ``rkpart`` group.
"""
