"""mkdocs hooks of the documentation site (mkdocs.yml ``hooks:``); not part of the factstream package."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli_reference import cli_reference

#: The line of docs/reference/cli.md that the generated reference replaces.
CLI_MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Put the CLI reference, generated from the commands, where its page has the marker."""
    if CLI_MARKER in markdown:
        return markdown.replace(CLI_MARKER, cli_reference())
    return markdown
