"""Names of streams, caches, jobs, commands, sync keys and plugin settings sections."""

from __future__ import annotations

import re

#: Names of streams, caches, jobs, commands and sync keys: lower-case identifiers, usable as SQL and
#: alembic branch labels without quoting.
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid factstream name, else raise ``ValueError`` saying why."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-63 characters, lower-case letters, digits and '_', "
            "starting with a letter"
        )
    return value
