"""What the specs of issue 46's framework pieces refuse: a kept stream (``StreamSpec(kept=True)``) with
what only a table stream has, a ``reset`` on a table stream's rows handler, an export job of a kept
stream; a ``CommandHandlerSpec`` of the core's commands, of a command that names no instance, of
something that is not a command, on an unknown stream, or of a command two plugins handle.

Specs are built directly where the spec itself refuses; what only the registry can see (another
registration) goes through real entry-point plugins (``plugin_installer``) and ``load_plugins``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from factstream import CommandHandlerSpec, PluginError, RowsHandlerSpec, StreamSpec, StreamTable
from factstream.plugin.manager import load_plugins
from factstream.replication import wire
from factstream.testing import PluginInstaller


@pytest.fixture(autouse=True)
def _without_the_bundled_presence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled presence plugin handles USER_SYNC itself: these tests' plugins take its place."""
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", "presence")


class Row(msgspec.Struct):
    key: str


async def _rows(request: Any) -> list[Any]:
    return []


def _kept(**overrides: Any) -> StreamSpec[Row]:
    return StreamSpec(**{"name": "kv", "row_type": Row, "tables": (), "kept": True, **overrides})


def _nothing(*args: Any) -> None:
    return None


# -- kept streams -----------------------------------------------------------------------------------


def test_a_kept_stream_without_tables_is_accepted_and_has_no_sequence_of_its_own_to_clash() -> None:
    spec = _kept(sync_key="kv", sync_rows=_rows)
    assert spec.kept and spec.tables == () and spec.positive


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"tables": (StreamTable("kv", "instance_name", "stream_id"),)}, "it has no tables, not 'kv'"),
        ({"update_function": _nothing}, "not update_function"),
        ({"positive": False}, "its positions grow upwards"),
        ({"sync_key": "kv"}, "a sync_key needs sync_rows"),
    ],
    ids=["tables", "update_function", "negative", "sync_key_without_sync_rows"],
)
def test_a_kept_stream_refuses_what_only_a_table_has_naming_the_stream(overrides: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError) as info:
        _kept(**overrides)
    assert "stream 'kv' is kept by its writer (kept=True)" in str(info.value)
    assert why in str(info.value)


def test_a_table_stream_without_tables_points_at_kept() -> None:
    with pytest.raises(ValueError, match=r"stream 'kv': tables must be a non-empty .*says kept=True"):
        StreamSpec(name="kv", row_type=Row, tables=())


def test_only_a_kept_stream_s_rows_handler_resets() -> None:
    table = StreamSpec(name="notes", row_type=Row, tables=(StreamTable("notes", "instance_name", "stream_id"),))
    with pytest.raises(ValueError, match=r"rows handler of stream 'notes': .*only a kept stream \(kept=True\) resets"):
        RowsHandlerSpec(stream=table, handler=_nothing, reset=_nothing)
    with pytest.raises(ValueError, match=r"rows handler of stream 'kv': reset must be callable"):
        RowsHandlerSpec(stream=_kept(), handler=_nothing, reset="not callable")  # type: ignore[arg-type]
    assert RowsHandlerSpec(stream=_kept(), handler=_nothing, reset=_nothing).reset is _nothing


KV_PLUGIN = """
import msgspec
import factstream
from factstream import ExportJobSpec, StreamSpec

class Row(msgspec.Struct):
    key: str

KV = StreamSpec(name="kv", row_type=Row, tables=(), kept=True)

@factstream.hookimpl
def register_streams(register):
    register(KV)

@factstream.hookimpl
def register_export_jobs(register):
    {export}
"""


def test_an_export_job_of_a_kept_stream_is_refused_when_the_registry_finishes(
    plugin_installer: PluginInstaller,
) -> None:
    plugin_installer.from_source("kv", KV_PLUGIN.format(export='register(ExportJobSpec(name="kv_dump", stream="kv"))'))
    with pytest.raises(PluginError) as info:
        load_plugins().registry  # noqa: B018
    assert "plugin 'kv': export job 'kv_dump' reads stream 'kv'" in str(info.value)
    assert "kept=True): there is no table to export" in str(info.value)


def test_two_kept_streams_share_no_sequence(plugin_installer: PluginInstaller) -> None:
    """The control of a sequence clash: kept streams have none, so two of them load side by side."""
    plugin_installer.from_source("kv", KV_PLUGIN.format(export="pass"))
    plugin_installer.from_source("kv2", KV_PLUGIN.replace('name="kv"', 'name="kv2"').format(export="pass"))
    registry = load_plugins().registry
    assert {"kv", "kv2"} <= {reg.spec.name for reg in registry.streams}


# -- command handlers -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [wire.RdataCommand, wire.PositionCommand, wire.ReplicateCommand])
def test_the_core_s_commands_are_refused(command: type[wire.Command]) -> None:
    with pytest.raises(ValueError, match=rf"command {command.NAME} is the core's: a plugin cannot handle it"):
        CommandHandlerSpec(command=command, stream="kv", handler=_nothing)


def test_a_command_that_names_no_instance_is_refused() -> None:
    with pytest.raises(ValueError) as info:
        CommandHandlerSpec(command=wire.UserIpCommand, stream="kv", handler=_nothing)
    assert "command USER_IP names no instance" in str(info.value)
    assert "CLEAR_USER_SYNC, FEDERATION_ACK, USER_SYNC" in str(info.value)


@pytest.mark.parametrize("command", [Row, wire.Command, "USER_SYNC", 3])
def test_something_that_is_not_one_of_the_codec_s_commands_is_refused(command: Any) -> None:
    with pytest.raises(ValueError, match=r"a command handler takes one of the codec's command classes, not"):
        CommandHandlerSpec(command=command, stream="kv", handler=_nothing)


@pytest.mark.parametrize("what", ["handler", "forget", "resend"])
def test_what_a_handler_calls_must_be_callable(what: str) -> None:
    with pytest.raises(ValueError, match=rf"handler of USER_SYNC: {what} must be callable"):
        CommandHandlerSpec(**{"command": wire.UserSyncCommand, "stream": "kv", "handler": _nothing, what: 42})


def test_the_reference_s_commands_that_name_an_instance_are_accepted() -> None:
    for command in (wire.UserSyncCommand, wire.ClearUserSyncCommand, wire.FederationAckCommand):
        assert CommandHandlerSpec(command=command, stream="kv", handler=_nothing).name == command.NAME


HANDLER_PLUGIN = """
import factstream
from factstream import CommandHandlerSpec, UserSyncCommand

@factstream.hookimpl
def register_command_handlers(register):
    register(CommandHandlerSpec(command=UserSyncCommand, stream={stream!r}, handler=lambda host, sender, cmd: None))
"""


def test_a_handler_on_an_unknown_stream_is_refused_at_finish(plugin_installer: PluginInstaller) -> None:
    plugin_installer.from_source("syncwatch", HANDLER_PLUGIN.format(stream="nowhere"))
    with pytest.raises(PluginError, match=r"plugin 'syncwatch' handles USER_SYNC on the writers of unknown stream"):
        load_plugins().registry  # noqa: B018


def test_two_plugins_handling_one_command_are_refused_naming_both(plugin_installer: PluginInstaller) -> None:
    plugin_installer.from_source("kv", KV_PLUGIN.format(export="pass"))
    plugin_installer.from_source("syncwatch", HANDLER_PLUGIN.format(stream="kv"))
    plugin_installer.from_source("lookalike", HANDLER_PLUGIN.format(stream="kv"))
    with pytest.raises(PluginError) as info:
        load_plugins().registry  # noqa: B018
    assert "USER_SYNC" in str(info.value)
    assert "'syncwatch'" in str(info.value) and "'lookalike'" in str(info.value)


def test_one_plugin_handling_a_command_on_its_stream_loads(plugin_installer: PluginInstaller) -> None:
    plugin_installer.from_source("kv", KV_PLUGIN.format(export="pass"))
    plugin_installer.from_source("syncwatch", HANDLER_PLUGIN.format(stream="kv"))
    [handled] = list(load_plugins().registry.command_handlers)
    assert (handled.plugin, handled.spec.name, handled.spec.stream) == ("syncwatch", "USER_SYNC", "kv")
