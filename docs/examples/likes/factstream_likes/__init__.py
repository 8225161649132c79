"""The ``likes`` plugin: who likes what, one fact per like on the ``likes`` stream.

The complete example of docs/writing-plugins.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import factstream
from factstream import (
    CacheSpec,
    ExportJobSpec,
    HostApi,
    InvalidationSpec,
    MigrationSpec,
    RegisterRowsHandler,
    RegisterStream,
    RouteSpec,
    RowsHandlerSpec,
    SettingsSpec,
    cached_specs,
)
from factstream_likes.routes import ROUTES
from factstream_likes.rows import COUNT_INVALIDATION, LIKES_STREAM, STREAM, LikeRow
from factstream_likes.settings import LikesSettings
from factstream_likes.store import LikesStore, RecentLikes

log = logging.getLogger(__name__)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(LIKES_STREAM)


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(LikesStore):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    register(COUNT_INVALIDATION)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_likes.migrations"))


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=LikesSettings))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(ExportJobSpec(name="likes_archive", stream=STREAM, description="every like: who liked what"))


def remember_likes(host: HostApi, instance: str, token: int, likes: Sequence[LikeRow], local: bool) -> None:
    """Every process keeps the likes it saw last; only the process that wrote a like logs it."""
    host.state(RecentLikes).add(instance, token, likes)
    if local:  # exactly one process sees a row with local=True: the one that wrote it
        for like in likes:
            log.info("%s: %s likes %s (stream ID %d)", host.instance_name, like.user_id, like.target, token)


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler) -> None:
    register(RowsHandlerSpec(stream=LIKES_STREAM, handler=remember_likes))
