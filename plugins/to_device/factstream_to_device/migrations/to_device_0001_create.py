"""to_device: device inboxes (the stream's table), transactions, known devices, deliveries; the sequence

Revision ID: to_device_0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision = "to_device_0001"
down_revision = None
branch_labels = ("to_device",)
depends_on = "fs_core_0001"


def upgrade() -> None:
    # One row per message per recipient device: the stream's facts. ``entity`` is the recipient user
    # (named like the wire row's field); ``content`` the JSON object exactly as sent.
    op.create_table(
        "device_inbox",
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("entity", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("sender", sa.Text, nullable=False),
        sa.Column("message_type", sa.Text, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("received_ts", sa.BigInteger, nullable=False),
    )
    op.create_index("device_inbox_stream_id", "device_inbox", ["stream_id"], unique=True)
    op.create_index("device_inbox_instance", "device_inbox", ["instance_name", "stream_id"])
    op.create_index("device_inbox_device", "device_inbox", ["entity", "device_id", "stream_id"])
    # Idempotency of PUT /sendToDevice/{type}/{txn_id}: one row per (sender, txn_id).
    op.create_table(
        "to_device_txns",
        sa.Column("sender", sa.Text, nullable=False),
        sa.Column("txn_id", sa.Text, nullable=False),
        sa.Column("request_hash", sa.Text, nullable=False),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("received_ts", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("sender", "txn_id"),
    )
    # The devices a "*" recipient expands to: every device that has synced or was registered.
    op.create_table(
        "to_device_devices",
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("first_seen_ts", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "device_id"),
    )
    # Per device and writer: the highest stream ID a /sync response has carried to the device. An
    # acknowledgement (a later token) deletes only messages at or below it.
    op.create_table(
        "device_inbox_delivered",
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("device_id", sa.Text, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "device_id", "instance_name"),
    )
    create_stream_sequence("device_inbox_sequence")


def downgrade() -> None:
    drop_stream_sequence("device_inbox_sequence")
    op.drop_table("device_inbox_delivered")
    op.drop_table("to_device_devices")
    op.drop_table("to_device_txns")
    op.drop_table("device_inbox")
