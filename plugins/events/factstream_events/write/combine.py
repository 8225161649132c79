"""Several writes sent as one statement: each a data-modifying ``WITH`` part of it.

A batch's writes go to up to ten tables. Sent one statement each, every one costs the client a
parse, bind and execute round of the driver (about 50 µs of CPU each in an asyncio pipeline) and the
server as much again; as the parts of one statement they cost one. PostgreSQL runs every part to
completion whether or not the statement reads it, all against the snapshot the statement starts
with: a part never sees what another writes. The writes combined here never read each other's rows
(distinct tables, or distinct rows of one), so that changes nothing. A unique violation in any part
fails the whole statement, as it failed the transaction before.

Each part keeps its own ``%(name)s`` parameters: they are renamed ``p<i>_name`` in the statement.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

_PARAM = re.compile(r"%\((\w+)\)([sb])")


@functools.lru_cache(maxsize=256)
def _render(parts: tuple[str, ...], final: str) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """The statement of ``parts`` (ending with ``final``), and the parameter names of each part and then
    of ``final``."""
    names: list[tuple[str, ...]] = []
    bodies = []
    for i, sql in enumerate((*parts, final)):
        names.append(tuple(dict.fromkeys(m.group(1) for m in _PARAM.finditer(sql))))
        bodies.append(_PARAM.sub(rf"%(p{i}_\1)\2", sql.strip()))
    if not parts:
        return bodies[-1], tuple(names)
    ctes = ",\n".join(f"w{i} AS ({body})" for i, body in enumerate(bodies[:-1]))
    return f"WITH {ctes}\n{bodies[-1]}", tuple(names)


class Writes:
    """Writes gathered for one statement: :meth:`add` each, then :meth:`statement`."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._params: list[Mapping[str, Any]] = []

    def add(self, sql: str, params: Mapping[str, Any]) -> None:
        """One write: an ``INSERT``, ``UPDATE`` or ``DELETE`` without a ``WITH`` of its own."""
        self._parts.append(sql)
        self._params.append(params)

    def statement(self, final: str = "SELECT 1", params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """The one statement and its parameters; ``final`` is the query it answers (with ``params``)."""
        sql, names = _render(tuple(self._parts), final)
        values: dict[str, Any] = {}
        for i, (part_names, part_params) in enumerate(zip(names, (*self._params, params or {}), strict=True)):
            for name in part_names:
                values[f"p{i}_{name}"] = part_params[name]
        return sql, values
