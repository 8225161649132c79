"""Locate the files factstream ships beside its code: the alembic environment and the templates.

In a built wheel they live inside the package (``factstream/_migrations``, ``factstream/_templates``);
in a source checkout (editable install) they are the top-level ``migrations/`` and ``templates/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _find(packaged: str, checkout: str) -> Path:
    inside = _PACKAGE_DIR / packaged
    if inside.is_dir():
        return inside
    source = _PACKAGE_DIR.parent.parent / checkout
    if source.is_dir():
        return source
    raise FileNotFoundError(f"factstream is missing its {checkout}/ directory (looked in {inside} and {source})")


def migrations_dir() -> Path:
    """The directory holding alembic's ``env.py``, ``script.py.mako`` and the core ``versions/``."""
    return _find("_migrations", "migrations")


def templates_dir() -> Path:
    """The directory holding the templates ``factstream new-stream`` renders."""
    return _find("_templates", "templates")
