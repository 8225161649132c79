"""The ``factstream`` console script's entry point, outside the ``factstream`` package.

Importing anything under ``factstream`` first imports the package's public API, and with it
SQLAlchemy, psycopg, pydantic and the rest: about a second in which a Ctrl-C raised
``KeyboardInterrupt`` before :func:`factstream.cli.main` could catch it, and Python printed the
traceback. This module imports nothing of factstream's until :func:`main` runs, inside its ``try``:
an interrupt at any moment ends with one line, ``interrupted``, and exit code 130.
"""

from __future__ import annotations

import sys

INTERRUPTED_EXIT_CODE = 130


def main() -> None:
    """Run ``factstream.cli.main``; a ``KeyboardInterrupt`` anywhere (the imports included) exits 130."""
    try:
        from factstream.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(INTERRUPTED_EXIT_CODE)
