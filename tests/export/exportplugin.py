"""A stream plugin for the export tests (registered in-process; its tables are made by ``TABLES_SQL``).

* ``ledger``: one stream over two backing tables (two row kinds: credits and debits), each with a
  column the replication row does not carry (``memo`` / ``reason``);
* ``rewind``: a backwards stream (IDs -2, -3, ...) with bool, float and list fields;
* ``shouty``: a stream read through the plugin's own update function;
* export jobs over each, one with a transform and a partition column.
"""

from __future__ import annotations

import msgspec
from pyspark.sql import functions as F

import factstream
from factstream import ExportJobSpec, StreamSpec, StreamTable


class LedgerRow(msgspec.Struct, frozen=True):
    account: str
    amount: int


class BackfillRow(msgspec.Struct, frozen=True):
    note: str
    ok: bool
    score: float
    tags: list[str]


class ShoutyRow(msgspec.Struct, frozen=True):
    loud: str


TABLES_SQL = [
    "CREATE TABLE ledger_credits (stream_id bigint PRIMARY KEY, instance_name text NOT NULL,"
    " account text NOT NULL, amount bigint NOT NULL, memo text)",
    "CREATE TABLE ledger_debits (stream_id bigint PRIMARY KEY, instance_name text NOT NULL,"
    " account text NOT NULL, amount bigint NOT NULL, reason text)",
    "CREATE SEQUENCE ledger_seq",
    "SELECT nextval('ledger_seq')",
    "CREATE TABLE rewind (stream_id bigint PRIMARY KEY, instance_name text NOT NULL, note text,"
    " ok boolean NOT NULL, score double precision NOT NULL, tags text[] NOT NULL)",
    "CREATE SEQUENCE rewind_seq",
    "SELECT nextval('rewind_seq')",
    "CREATE TABLE shouty (stream_id bigint PRIMARY KEY, instance_name text NOT NULL, said text NOT NULL)",
    "CREATE SEQUENCE shouty_seq",
    "SELECT nextval('shouty_seq')",
]


async def shouty_updates(db, instance, from_token, upto_token, limit):
    """The plugin's own update function: rows are derived from the table (upper-cased)."""
    rows = await db.fetchall(
        "SELECT stream_id, said FROM shouty WHERE instance_name = %(i)s AND stream_id > %(lo)s"
        " AND stream_id <= %(hi)s ORDER BY stream_id LIMIT %(n)s",
        {"i": instance, "lo": from_token, "hi": upto_token, "n": limit},
    )
    updates = [(int(r[0]), ShoutyRow(str(r[1]).upper())) for r in rows]
    if len(rows) < limit:
        return updates, upto_token, False
    return updates, updates[-1][0], True


def with_sign(df):
    """The ledger job's transform: derive a column and keep only non-zero amounts."""
    return df.where(F.col("amount") != 0).withColumn("sign", F.when(F.col("amount") > 0, "credit").otherwise("debit"))


@factstream.hookimpl
def register_streams(register):
    register(
        StreamSpec(
            name="ledger",
            row_type=LedgerRow,
            tables=(
                StreamTable("ledger_credits", "instance_name", "stream_id"),
                StreamTable("ledger_debits", "instance_name", "stream_id"),
            ),
            writers="any",
        )
    )
    register(
        StreamSpec(
            name="rewind",
            row_type=BackfillRow,
            tables=(StreamTable("rewind", "instance_name", "stream_id"),),
            positive=False,
            writers="any",
        )
    )
    register(
        StreamSpec(
            name="shouty",
            row_type=ShoutyRow,
            tables=(StreamTable("shouty", "instance_name", "stream_id"),),
            writers="any",
            update_function=shouty_updates,
        )
    )


@factstream.hookimpl
def register_export_jobs(register):
    register(ExportJobSpec(name="ledger_raw", stream="ledger"))
    register(ExportJobSpec(name="ledger_signed", stream="ledger", transform=with_sign, partition_by=("sign",)))
    register(ExportJobSpec(name="rewind_all", stream="rewind"))
    register(ExportJobSpec(name="shouty_all", stream="shouty"))
