"""The plugin manager: discovery through entry points, selection, validation, errors naming plugins."""

from __future__ import annotations

import logging

import pytest

from factstream.errors import PluginError
from factstream.plugin.manager import LeftOut, load_plugins
from factstream.testing import PluginInstaller

NOTES_DUPLICATE = """
    import msgspec
    import factstream
    from factstream import StreamSpec, StreamTable

    class Row(msgspec.Struct):
        text: str

    @factstream.hookimpl
    def register_streams(register):
        register(StreamSpec(name="notes", row_type=Row, tables=(StreamTable("other_notes", "instance", "id"),)))
"""


def test_installed_plugin_is_discovered_through_its_entry_point(plugin_installer: PluginInstaller, notes_project):
    plugin_installer.from_project(notes_project)

    host = load_plugins()

    info = host.plugins["notes"]
    assert (info.distribution, info.version, info.module) == ("factstream-testnotes", "0.3.1", "factstream_notes")
    assert host.registry.streams.owner("notes") == "notes"
    assert host.registry.streams.get("notes").sequence == "notes_seq"
    assert "notes" in host.registry.migrations


def test_blocked_plugin_is_not_loaded(plugin_installer: PluginInstaller, notes_project, monkeypatch):
    plugin_installer.from_project(notes_project)
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", "other, notes")

    host = load_plugins()

    assert "notes" not in host.plugins
    assert "notes" not in host.registry.streams


def test_the_host_remembers_which_installed_plugins_were_left_out_and_why(
    plugin_installer: PluginInstaller, notes_project, monkeypatch
):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("likes", "")
    plugin_installer.from_source("memos", "")
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", "other, notes")
    monkeypatch.setenv("FACTSTREAM_LOAD_PLUGINS", "notes, likes")

    host = load_plugins()

    assert set(host.plugins) == {"factstream", "likes"}
    assert host.left_out["notes"] is LeftOut.BLOCKED  # blocked, though FACTSTREAM_LOAD_PLUGINS names it
    assert host.left_out["memos"] is LeftOut.NOT_SELECTED
    assert "other" not in host.left_out  # blocked, but not installed


def test_load_list_loads_only_the_named_plugins(plugin_installer: PluginInstaller, notes_project, monkeypatch):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("likes", "")
    monkeypatch.setenv("FACTSTREAM_LOAD_PLUGINS", "likes")

    host = load_plugins()

    assert set(host.plugins) == {"factstream", "likes"}


def test_load_list_naming_an_uninstalled_plugin_is_an_error(plugin_installer: PluginInstaller, monkeypatch):
    plugin_installer.from_source("likes", "")
    monkeypatch.setenv("FACTSTREAM_LOAD_PLUGINS", "likes,nope")

    with pytest.raises(PluginError, match=r"FACTSTREAM_LOAD_PLUGINS names 'nope', which is not installed"):
        load_plugins()


def test_duplicate_stream_from_two_plugins_names_both(plugin_installer: PluginInstaller, notes_project):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("copycat", NOTES_DUPLICATE)

    with pytest.raises(PluginError) as info:
        load_plugins().registry  # noqa: B018

    assert "duplicate stream 'notes'" in str(info.value)
    assert "'copycat'" in str(info.value) and "'notes'" in str(info.value)


def test_misspelt_hook_fails_loudly_with_a_suggestion(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "typo",
        """
        import factstream

        @factstream.hookimpl
        def register_stream(register):
            pass
        """,
    )

    with pytest.raises(
        PluginError,
        match=r"plugin 'typo' implements unknown hook 'register_stream' \(did you mean 'register_streams'\?\)",
    ):
        load_plugins()


def test_hook_with_unknown_argument_is_rejected(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "badargs",
        """
        import factstream

        @factstream.hookimpl
        def register_streams(register, colour):
            pass
        """,
    )

    with pytest.raises(PluginError, match=r"plugin 'badargs' has an invalid hook implementation"):
        load_plugins()


def test_plugin_that_raises_during_registration_is_named(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "boom",
        """
        import factstream

        @factstream.hookimpl
        def register_caches(register):
            raise RuntimeError("database of cache names is missing")
        """,
    )

    with pytest.raises(PluginError, match=r"plugin 'boom' failed in hook register_caches: RuntimeError: database"):
        load_plugins().registry  # noqa: B018


def test_invalid_spec_is_rejected_naming_the_plugin(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "badname",
        """
        import factstream
        from factstream import CacheSpec

        @factstream.hookimpl
        def register_caches(register):
            register(CacheSpec(name="Bad Name"))
        """,
    )

    with pytest.raises(
        PluginError, match=r"plugin 'badname' failed in hook register_caches: ValueError: invalid cache name 'Bad Name'"
    ):
        load_plugins().registry  # noqa: B018


def test_plugin_that_cannot_be_imported_is_named(plugin_installer: PluginInstaller):
    plugin_installer.from_source("broken", "import not_a_module_anywhere\n")

    with pytest.raises(
        PluginError, match=r"plugin 'broken' \(factstream_broken\) cannot be imported: ModuleNotFoundError"
    ):
        load_plugins()


def test_invalidation_of_unknown_cache_is_rejected_at_startup(plugin_installer: PluginInstaller, notes_project):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source(
        "stale",
        """
        import factstream
        from factstream import InvalidationSpec

        @factstream.hookimpl
        def register_invalidations(register):
            register(InvalidationSpec(stream="notes", cache="notes_by_author", keys=lambda row: [(row.author,)]))
        """,
    )

    with pytest.raises(
        PluginError, match=r"plugin 'stale' declares an invalidation of unknown cache 'notes_by_author'"
    ):
        load_plugins().registry  # noqa: B018


def test_two_streams_claiming_one_sync_key_are_rejected(plugin_installer: PluginInstaller, notes_project):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source(
        "clash",
        """
        import msgspec
        import factstream
        from factstream import StreamSpec, StreamTable

        class Row(msgspec.Struct):
            x: int

        @factstream.hookimpl
        def register_streams(register):
            tables = (StreamTable("memos", "i", "s"),)
            register(StreamSpec(name="memos", row_type=Row, tables=tables, sync_key="notes_key"))
        """,
    )

    with pytest.raises(
        PluginError,
        match=r"sync key 'notes_key' is claimed by streams 'memos' \(plugin 'clash'\) and 'notes' \(plugin 'notes'\)",
    ):
        load_plugins().registry  # noqa: B018


def test_two_distributions_with_the_same_plugin_name_are_rejected(plugin_installer: PluginInstaller):
    plugin_installer.from_source("twin", "", module="factstream_twin_a", distribution="twin-a")
    plugin_installer.from_source("twin", "", module="factstream_twin_b", distribution="twin-b")

    with pytest.raises(PluginError, match=r"two installed plugins are named 'twin'.*'twin-a'.*'twin-b'"):
        load_plugins()


def test_a_plugin_may_not_take_the_core_name(plugin_installer: PluginInstaller):
    plugin_installer.from_source("factstream", "", module="factstream_impostor", distribution="impostor")

    with pytest.raises(
        PluginError, match=r"distribution 'impostor' declares a plugin named 'factstream', which is reserved"
    ):
        load_plugins()


def test_tracing_logs_every_hook_call_with_the_plugin(
    plugin_installer: PluginInstaller, notes_project, monkeypatch, caplog
):
    plugin_installer.from_project(notes_project)
    monkeypatch.setenv("FACTSTREAM_TRACE_HOOKS", "1")

    with caplog.at_level(logging.INFO, logger="factstream.hooks"):
        load_plugins().registry  # noqa: B018

    messages = [r.getMessage() for r in caplog.records]
    assert "call notes.register_streams(register)" in messages
    assert any(m.startswith("  notes registered StreamSpec(name='notes'") for m in messages)


async def test_startup_failure_names_the_plugin_and_shutdown_runs_all(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "lifecycle",
        """
        import factstream
        calls = []

        @factstream.hookimpl
        async def startup(host):
            calls.append(("startup", host))
            raise ValueError("no port")

        @factstream.hookimpl
        def shutdown(host):
            calls.append(("shutdown", host))
            raise ValueError("already gone")
        """,
    )
    plugin_installer.from_source(
        "polite",
        """
        import factstream
        calls = []

        @factstream.hookimpl
        def shutdown(host):
            calls.append("shutdown")
        """,
    )
    host = load_plugins()

    with pytest.raises(PluginError, match=r"plugin 'lifecycle' failed in hook startup: ValueError: no port"):
        await host.startup("the-host")
    errors = await host.shutdown("the-host")

    import factstream_lifecycle
    import factstream_polite

    assert factstream_lifecycle.calls == [("startup", "the-host"), ("shutdown", "the-host")]
    assert factstream_polite.calls == ["shutdown"]
    assert [str(e) for e in errors] == ["plugin 'lifecycle' failed in hook shutdown: ValueError: already gone"]


# -- rows handlers: called in order, a failing one named and skipped ---------------------------------

ROWS_LOG = """
    import asyncio
    import msgspec
    import factstream
    from factstream import RowsHandlerSpec, StreamSpec, StreamTable

    class Note(msgspec.Struct):
        text: str

    NOTES = StreamSpec(name="notes", row_type=Note, tables=(StreamTable("notes", "instance_name", "stream_id"),))
    seen = []

    def handle(host, instance, token, rows, local):
        seen.append(("{name}", instance, token, list(rows)))
        {body}

    @factstream.hookimpl
    def register_rows_handlers(register):
        register(RowsHandlerSpec(stream=NOTES, handler=handle))
"""


#: A module the next plugins share: the ``notes`` stream's spec and a log of their calls.
ORDER_LOG = """
    import msgspec
    from factstream import StreamSpec, StreamTable

    class Note(msgspec.Struct):
        text: str

    NOTES = StreamSpec(name="notes", row_type=Note, tables=(StreamTable("notes", "instance_name", "stream_id"),))
    log = []
"""


def _notes_handlers(host: object | None = None):
    """The ``notes`` stream's handlers of the installed plugins, bound to a stand-in host."""
    return load_plugins().rows_handlers(object() if host is None else host)["notes"]


async def _deliver(handlers, token: int, local: bool = False) -> None:
    result = handlers.deliver("main", token, [f"row{token}"], local)
    if result is not None:
        await result


def _install_rows_log(plugin_installer: PluginInstaller, name: str, kind: str, failing_token: int | None) -> None:
    """A plugin recording its handler's calls (``kind``: "sync" or "async"), raising at ``failing_token``."""
    body = "pass" if failing_token is None else f"if token == {failing_token}: raise RuntimeError('bad row')"
    source = ROWS_LOG
    if kind == "async":
        source = source.replace("def handle", "async def handle")
        body = "await asyncio.sleep(0)\n        " + body
    plugin_installer.from_source(name, source.format(name=name, body=body))


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_rows_reach_every_plugins_handler_in_hook_order_and_a_raising_one_is_logged_by_name(
    plugin_installer: PluginInstaller, caplog, kind
):
    _install_rows_log(plugin_installer, "alpha", kind, failing_token=2)
    _install_rows_log(plugin_installer, "beta", kind, failing_token=None)
    handlers = _notes_handlers()

    with caplog.at_level(logging.ERROR, logger="factstream.plugin.manager"):
        for token in (1, 2, 3):
            await _deliver(handlers, token)

    import factstream_alpha
    import factstream_beta

    assert [s[2] for s in factstream_alpha.seen] == [1, 2, 3]
    assert factstream_beta.seen == [("beta", "main", t, [f"row{t}"]) for t in (1, 2, 3)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["plugin 'alpha' failed handling rows of stream 'notes': RuntimeError: bad row"]


async def test_an_async_handler_finishes_before_the_next_plugin_sees_the_rows(plugin_installer: PluginInstaller):
    order = """
        import asyncio
        import factstream
        from factstream import RowsHandlerSpec
        from factstream_order_log import NOTES, log

        async def handle(host, instance, token, rows, local):
            log.append(("slow", "start", token))
            await asyncio.sleep(0.01)
            log.append(("slow", "end", token))

        @factstream.hookimpl
        def register_rows_handlers(register):
            register(RowsHandlerSpec(stream=NOTES, handler=handle))
    """
    quick = """
        import factstream
        from factstream import RowsHandlerSpec
        from factstream_order_log import NOTES, log

        def handle(host, instance, token, rows, local):
            log.append(("quick", token))

        @factstream.hookimpl
        def register_rows_handlers(register):
            register(RowsHandlerSpec(stream=NOTES, handler=handle))
    """
    plugin_installer.from_source("order_log", ORDER_LOG)
    plugin_installer.from_source("slow", order)
    plugin_installer.from_source("quick", quick)
    handlers = _notes_handlers()

    for token in (1, 2):
        await _deliver(handlers, token)

    import factstream_order_log

    # pluggy's order: the plugin registered last (here "slow", loaded in name order) is called first.
    assert factstream_order_log.log == [
        ("slow", "start", 1),
        ("slow", "end", 1),
        ("quick", 1),
        ("slow", "start", 2),
        ("slow", "end", 2),
        ("quick", 2),
    ]


async def test_a_single_handler_is_called_directly_and_still_named_when_it_fails(
    plugin_installer: PluginInstaller, caplog
):
    plugin_installer.from_source("alpha", ROWS_LOG.format(name="alpha", body="raise KeyError('x')"))
    handlers = _notes_handlers()

    with caplog.at_level(logging.ERROR, logger="factstream.plugin.manager"):
        assert handlers.deliver("main", 7, ["r"], False) is None

    import factstream_alpha

    assert factstream_alpha.seen == [("alpha", "main", 7, ["r"])]
    assert [r.getMessage() for r in caplog.records] == [
        "plugin 'alpha' failed handling rows of stream 'notes': KeyError: 'x'"
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_run_of_tokens_reaches_a_single_handler_in_order_one_token_at_a_time(
    plugin_installer: PluginInstaller, caplog, kind
):
    """The pipeline hands a lone handler a whole run (``StreamHandlers.run``): the same calls as token by token."""
    _install_rows_log(plugin_installer, "alpha", kind, failing_token=12)
    handlers = _notes_handlers()

    with caplog.at_level(logging.ERROR, logger="factstream.plugin.manager"):
        waiting = handlers.run("main", [10, 11, 12, 13], ["a", "b", "c", "d"], False)
        if kind == "sync":
            assert waiting is None  # synchronous handlers: no coroutine at all
        else:
            await waiting

    import factstream_alpha

    assert factstream_alpha.seen == [
        ("alpha", "main", token, [row]) for token, row in zip([10, 11, 12, 13], "abcd", strict=True)
    ]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["plugin 'alpha' failed handling rows of stream 'notes': RuntimeError: bad row"]


async def test_local_and_the_host_reach_every_handler(plugin_installer: PluginInstaller):
    both = """
        import factstream
        from factstream import RowsHandlerSpec
        from factstream_order_log import NOTES, log

        def handle(host, instance, token, rows, local):
            log.append(("{name}", host, token, local))

        @factstream.hookimpl
        def register_rows_handlers(register):
            register(RowsHandlerSpec(stream=NOTES, handler=handle))
    """
    plugin_installer.from_source("order_log", ORDER_LOG)
    plugin_installer.from_source("first", both.replace("{name}", "first"))
    plugin_installer.from_source("second", both.replace("{name}", "second"))
    handlers = _notes_handlers("the-host")

    await _deliver(handlers, 1, local=True)
    await _deliver(handlers, 2, local=False)
    waiting = handlers.run("main", [3, 4], ["c", "d"], True)
    assert waiting is None

    import factstream_order_log

    assert sorted(factstream_order_log.log) == sorted(
        [(name, "the-host", token, token in (1, 3, 4)) for name in ("first", "second") for token in (1, 2, 3, 4)]
    )


def test_a_handler_of_a_stream_registered_with_another_row_type_stops_the_start_naming_both(
    plugin_installer: PluginInstaller, notes_project
):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("alpha", ROWS_LOG.format(name="alpha", body="pass"))

    with pytest.raises(PluginError) as info:
        load_plugins().registry  # noqa: B018

    assert (
        "plugin 'alpha' handles rows of stream 'notes' as Note, but plugin 'notes' registered it with row type"
        in str(info.value)
    )


def test_each_register_takes_only_its_own_spec_type_naming_plugin_and_hook(plugin_installer: PluginInstaller):
    plugin_installer.from_source(
        "mixup",
        """
        import factstream
        from factstream import CacheSpec

        @factstream.hookimpl
        def register_streams(register):
            register(CacheSpec(name="mixed"))
        """,
    )

    with pytest.raises(
        PluginError,
        match=r"plugin 'mixup' registered CacheSpec\(name='mixed'.*\) in register_streams, which takes a StreamSpec",
    ):
        load_plugins().registry  # noqa: B018
