"""The ``${name}`` plugin: ${description_py}

Each hook below hands factstream one piece of the stream; see the README for what to edit first.
"""

from __future__ import annotations

from collections.abc import Callable

import factstream
from factstream import (
    CacheSpec,
% if export:
    ExportJobSpec,
% endif
    InvalidationSpec,
    MigrationSpec,
    RegisterStream,
    RouteSpec,
    SettingsSpec,
    cached_specs,
)

from ${package}.routes import ROUTES
% if export:
from ${package}.rows import COUNT_INVALIDATION, ${upper}_STREAM, STREAM
% else:
from ${package}.rows import COUNT_INVALIDATION, ${upper}_STREAM
% endif
from ${package}.settings import ${camel}Settings
from ${package}.store import ${camel}Store


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(${upper}_STREAM)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("${package}.migrations"))


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(${camel}Store):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    register(COUNT_INVALIDATION)


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=${camel}Settings))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)
% if export:


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    # `factstream export ${name}_all` writes every fact as Parquet; add a transform to aggregate.
    register(ExportJobSpec(name="${name}_all", stream=STREAM, description="every ${name} fact, as written"))
% endif
