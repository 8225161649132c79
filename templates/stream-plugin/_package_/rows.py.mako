"""The ``${name}`` stream: its row, its table, and which cached reads a row makes stale."""

from __future__ import annotations

import msgspec
from factstream import InvalidationSpec, StreamSpec, StreamTable

STREAM = "${name}"
#: The cache of the number of facts per key, keyed ``(key,)`` (declared by ``${camel}Store.count``).
COUNT_CACHE = "${name}_per_key"


class ${camel}Row(msgspec.Struct, frozen=True):
    """One fact. Replication sends it as ``[user_id, key, value]``: the fields in this order.

    Edit this first: add fields here, their columns in the migration, and their checks in routes.py.
    """

    user_id: str
    key: str
    value: str


${upper}_STREAM = StreamSpec(
    name=STREAM,
    row_type=${camel}Row,
    tables=(StreamTable(table="${name}", instance_column="instance_name", id_column="stream_id"),),
% if sync:
    sync_key="${name}_key",
    user_field="user_id",  # /sync shows a fact to its user only, and wakes only that user's long polls
% endif
    description="${description_py}",
)


def stale_counts(row: ${camel}Row) -> list[tuple[str]]:
    """A new fact changes the count of its key, and nothing else."""
    return [(row.key,)]


#: Run on every instance for every row, written there or replicated, before anyone can read past it.
COUNT_INVALIDATION = InvalidationSpec(stream=STREAM, cache=COUNT_CACHE, keys=stale_counts)
