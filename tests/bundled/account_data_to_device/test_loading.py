"""Both plugins are found through their entry points, migrate on their own branches, can be blocked,
and the core knows nothing of them."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import psycopg

from factstream.db.engine import libpq_url
from factstream.migrate import Migrator
from factstream.plugin.manager import PluginSelection, load_plugins

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = {"account_data": "factstream-account-data", "to_device": "factstream-to-device"}
TABLES = {
    "account_data": {"account_data_stream", "account_data_latest"},
    "to_device": {"device_inbox", "to_device_txns", "to_device_devices", "device_inbox_delivered"},
}


def tables(url: str) -> set[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_both_plugins_are_discovered_through_their_entry_points():
    entry_points = {ep.name: ep for ep in metadata.entry_points(group="factstream")}
    plugins = load_plugins(PluginSelection())

    for name, distribution in PLUGINS.items():
        assert entry_points[name].value == f"factstream_{name}"
        info = plugins.plugins[name]
        assert (info.distribution, info.builtin) == (distribution, False)
    registry = plugins.registry
    assert {"account_data", "to_device"} <= set(registry.streams.names())
    assert registry.streams.get("account_data").row_fields == ("user_id", "room_id", "data_type")
    assert registry.streams.get("to_device").row_fields == ("entity",)
    assert "account_data_latest" in registry.export_jobs.names()
    assert {r.spec.path for r in registry.routes} >= {
        "/user/{user_id}/account_data/{type}",
        "/user/{user_id}/rooms/{room_id}/account_data/{type}",
        "/sendToDevice/{event_type}/{txn_id}",
        "/devices/{device_id}",
    }


def test_each_migrates_on_its_own_branch(fresh_database):
    migrator = Migrator(fresh_database, load_plugins(PluginSelection()))
    try:
        migrator.upgrade()
        status = {s.branch: s for s in migrator.status()}
    finally:
        migrator.close()

    for name in PLUGINS:
        assert status[name].up_to_date and status[name].current == f"{name}_0001"
    assert TABLES["account_data"] | TABLES["to_device"] <= tables(fresh_database)


def test_blocked_they_register_nothing_and_create_no_tables(fresh_database):
    plugins = load_plugins(PluginSelection(blocked=frozenset(PLUGINS)))
    migrator = Migrator(fresh_database, plugins)
    try:
        migrator.upgrade()
        branches = {s.branch for s in migrator.status()}
    finally:
        migrator.close()

    assert not set(PLUGINS) & set(plugins.plugins)
    assert not set(PLUGINS) & set(plugins.registry.streams.names())
    assert not set(PLUGINS) & branches
    assert not any("account_data" in r.spec.path or "ToDevice" in r.spec.path for r in plugins.registry.routes)
    assert not (TABLES["account_data"] | TABLES["to_device"]) & tables(fresh_database)


def test_an_instance_with_a_migrated_plugin_blocked_refuses_to_start_saying_unblock_or_detach(fresh_database, run_cli):
    migrator = Migrator(fresh_database, load_plugins(PluginSelection()))
    try:
        migrator.upgrade()
    finally:
        migrator.close()
    env = dict(os.environ, FACTSTREAM_DATABASE__URL=fresh_database, FACTSTREAM_BLOCK_PLUGINS="to_device")

    started = run_cli("run", "--http-port", "0", env=env)
    status = run_cli("migrate", "status", env=env)

    assert started.returncode == 2, started.stdout + started.stderr
    assert "Traceback" not in started.stderr
    message = " ".join(started.stderr.split())
    assert (
        "error: the database has migrations of a plugin that is not loaded: revision 'to_device_0001' belongs to "
        "plugin 'to_device', which is installed but blocked by FACTSTREAM_BLOCK_PLUGINS. Unblock it (take to_device "
        "out of FACTSTREAM_BLOCK_PLUGINS), or detach its migrations with `factstream migrate detach to_device` "
        "(its tables are kept)."
    ) in message
    assert "not migrated" not in message and "run `factstream migrate` first" not in message
    assert status.returncode == 0, status.stderr
    assert re.search(r"to_device\s+│\s+to_device_0001\s+│\s+-\s+│\s+blocked by FACTSTREAM_BLOCK_PLUGINS", status.stdout)


def test_the_core_never_names_them():
    for path in [*(ROOT / "framework").rglob("*.py"), *(ROOT / "migrations").rglob("*.py")]:
        text = path.read_text()
        for word in ("factstream_account_data", "factstream_to_device", "account_data_stream", "device_inbox"):
            assert word not in text, f"{path.relative_to(ROOT)} mentions {word}"
