"""``python -m factstream`` runs the CLI."""

from factstream.cli import main

main()
