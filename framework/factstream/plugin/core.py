"""The core's own registrations, made through the same hooks as every plugin (plugin name ``factstream``)."""

from __future__ import annotations

from collections.abc import Callable

from factstream.plugin.hookspecs import hookimpl
from factstream.plugin.specs import MigrationSpec
from factstream.resources import migrations_dir


@hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec(migrations_dir() / "versions"))
