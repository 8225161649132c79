"""The public API that plugin authors read about is the one ``factstream.__all__`` exports."""

from __future__ import annotations

import re
from pathlib import Path

import factstream

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "writing-plugins.md"
TABLE_INTRO = "`factstream/__init__.py` defines the public API in `__all__`:"


def documented_public_names() -> set[str]:
    """The names in the first column of the plugin guide's public API table."""
    text = GUIDE.read_text()
    table = text[text.index(TABLE_INTRO) + len(TABLE_INTRO) :].strip().split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # after the header and rule
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_the_plugin_guide_lists_exactly_the_names_in_all() -> None:
    assert documented_public_names() == set(factstream.__all__)


def test_writer_leases_are_not_public_but_importable_from_idgen() -> None:
    from factstream.idgen.leases import WriterLeases

    assert "WriterLeases" not in factstream.__all__
    assert not hasattr(factstream, "WriterLeases")
    assert WriterLeases.__module__ == "factstream.idgen.leases"
