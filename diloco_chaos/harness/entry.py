"""The `diloco-chaos` executable's first module: starts the run's forkserver, then hands over to the command line.

What: `main` looks at the raw arguments; when the command runs a scenario in this process (`run`, `compare`,
`replay` without `--against`) it starts the forkserver (diloco_chaos/harness/run/forkserver.py) before importing
the command line, then calls diloco_chaos.harness.cli.main. Why a module of its own: the command line imports
torch (its validation builds the task's model), and so does the forkserver; started first, the forkserver
imports on the second core while this process imports and validates, instead of after it. A command that ends
before its run starts (a refused scenario, bad arguments) stops the forkserver on exit, so nothing outlives it.
`python -m diloco_chaos.harness.entry` is the same command as `diloco-chaos`.
"""

from __future__ import annotations

import sys

from diloco_chaos.harness.run import forkserver

RUN_COMMANDS = ("run", "compare", "replay")


def starts_a_run(argv: list[str]) -> bool:
    """Whether `argv` (the arguments after the program name) names a command that runs a scenario here."""
    if not argv or argv[0] not in RUN_COMMANDS:
        return False
    return not any(a in ("-h", "--help", "--against") or a.startswith("--against=") for a in argv[1:])


def main(argv: list[str] | None = None) -> int:
    if starts_a_run(sys.argv[1:] if argv is None else argv):
        forkserver.warm()
    from diloco_chaos.harness.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
