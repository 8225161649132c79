"""The bundled ``caches`` stream plugin: cross-process cache invalidation.

It provides what the core's cache registry needs to reach other processes (see
``factstream.caches.invalidate`` for the contract): the ``caches`` stream (writers ``any``), its
table ``cache_invalidation_stream_by_instance`` and sequence, in the migration branch ``caches``.
The core finds the stream by its name when a host starts: every ``host.caches.invalidate(txn, ...)``
then also writes a row here, and rows replicated from other instances are applied to this process's
caches before the stream's position advances.

Its export job ``caches_hourly`` counts invalidations per cache per hour (``factstream_caches.export``).

On the main instance it also runs retention (``factstream_caches.retention``) as a background task
(``host.spawn``, started in ``startup``; the host cancels it when it stops).
"""

from __future__ import annotations

from collections.abc import Callable

import factstream
from factstream import ExportJobSpec, HostApi, MigrationSpec, RegisterStream
from factstream_caches.export import CACHES_HOURLY
from factstream_caches.retention import delete_old_invalidations, run_retention
from factstream_caches.rows import CACHES_STREAM, TABLE, CacheInvalidationRow

__all__ = ["CACHES_STREAM", "TABLE", "CacheInvalidationRow", "delete_old_invalidations"]


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(CACHES_STREAM)


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(CACHES_HOURLY)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_caches.migrations"))


@factstream.hookimpl
def startup(host: HostApi) -> None:
    if host.instance_name == host.main_instance:
        host.spawn(run_retention(host), name="caches-retention")
