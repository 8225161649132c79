"""The bundled ``to_device`` stream plugin: send-to-device messages, per device inbox.

* Stream ``to_device`` (row ``[entity]``: the recipient user, the reference's wire row), written by
  the configured writers (``stream_writers.to_device``; several are allowed), synced under the token
  key ``to_device_key``: a device's ``/sync`` delivers its pending messages in order and deletes
  them only once a later sync acknowledges them (``factstream_to_device.sync``). A row wakes the
  long polls of its recipient.
* Tables ``device_inbox`` (the messages, content kept byte for byte), ``to_device_txns``
  (idempotency per sender and transaction ID), ``to_device_devices`` (what ``"*"`` expands to) and
  ``device_inbox_delivered``, in the migration branch ``to_device``.
* Routes ``PUT /sendToDevice/{event_type}/{txn_id}`` and ``PUT /devices/{device_id}``.
* Settings ``plugins.to_device`` (``max_body_bytes``; ``factstream_to_device.settings``).

See docs/plugins/to_device.md.
"""

from __future__ import annotations

from collections.abc import Callable

import factstream
from factstream import ExportJobSpec, MigrationSpec, RegisterStream, RouteSpec, SettingsSpec, StreamSpec
from factstream_to_device.export import TO_DEVICE_DAILY
from factstream_to_device.routes import ROUTES
from factstream_to_device.rows import SEQUENCE, STREAM, SYNC_KEY, TABLES, ToDeviceRow
from factstream_to_device.settings import ToDeviceSettings
from factstream_to_device.store import ToDeviceStore
from factstream_to_device.sync import sync_to_device

__all__ = ["TO_DEVICE_STREAM", "ToDeviceRow", "ToDeviceSettings", "ToDeviceStore"]

TO_DEVICE_STREAM = StreamSpec(
    name=STREAM,
    row_type=ToDeviceRow,
    tables=TABLES,
    sequence=SEQUENCE,
    writers="configured",
    sync_key=SYNC_KEY,
    user_field="entity",
    sync_rows=sync_to_device,
    description="send-to-device messages: one fact per message per recipient device",
)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(TO_DEVICE_STREAM)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_to_device.migrations"))


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(TO_DEVICE_DAILY)


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=ToDeviceSettings))
