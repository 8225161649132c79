"""Plugin settings: a ``plugins.<name>`` section validated at start-up against the model the plugin registered."""

from __future__ import annotations

import importlib
import logging

import pytest

from factstream.config import load_config
from factstream.errors import ConfigError
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins

TUNED = """
    import factstream
    from pydantic import BaseModel, ConfigDict, Field

    class TunedSettings(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        batch_size: int = Field(default=100, ge=1, le=10_000)
        greeting: str = "hello"

    seen = []

    @factstream.hookimpl
    def register_settings(register):
        register(factstream.SettingsSpec(model=TunedSettings))

    @factstream.hookimpl
    def startup(host):
        seen.append(host.plugin_settings(TunedSettings))
"""

BARE = """
    import factstream

    @factstream.hookimpl
    def startup(host):
        pass
"""


@pytest.fixture
def tuned(plugin_installer):
    plugin_installer.from_source("tuned", TUNED)
    plugin_installer.from_source("bare", BARE)
    return importlib.import_module("factstream_tuned")


def _settings(url: str, tmp_path, environ: dict[str, str] | None = None, **plugins: object):
    return load_config(
        environ=environ or {},
        database={"url": url},
        state_dir=str(tmp_path / "state"),
        plugins=plugins,
    )


async def _start(settings) -> Host:
    host = Host(settings, load_plugins())
    await host.start()
    return host


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"batch_size": 0},
            r"plugins\.tuned\.batch_size \(env FACTSTREAM_PLUGINS__TUNED__BATCH_SIZE\): .*greater than",
        ),
        ({"batch_size": "many"}, r"plugins\.tuned\.batch_size .*valid integer.*\(got 'many'\)"),
        ({"bacth_size": 5}, r"plugins\.tuned\.bacth_size .*unknown key"),
    ],
)
async def test_a_bad_value_stops_start_up_naming_the_plugin_and_the_key(
    tuned, fresh_database, tmp_path, section, message
):
    host = Host(_settings(fresh_database, tmp_path, tuned=section), load_plugins())
    with pytest.raises(ConfigError, match=r"invalid settings of plugin 'tuned': " + message):
        await host.start()
    assert tuned.seen == []  # no hook ran


async def test_a_section_for_a_plugin_that_takes_no_settings_is_refused(tuned, fresh_database, tmp_path):
    host = Host(_settings(fresh_database, tmp_path, bare={"x": 1}), load_plugins())
    with pytest.raises(ConfigError, match=r"plugins\.bare: plugin 'bare' takes no settings"):
        await host.start()


async def test_values_come_from_the_file_and_the_environment_overrides_them(tuned, migrated_database, tmp_path, caplog):
    environ = {"FACTSTREAM_PLUGINS__TUNED__BATCH_SIZE": "250"}
    settings = _settings(migrated_database, tmp_path, environ, tuned={"batch_size": 5, "greeting": "hi"}, gone={})
    with caplog.at_level(logging.WARNING, logger="factstream.host.facade"):
        host = await _start(settings)
    try:
        model = type(tuned.seen[0])
        assert host.api.plugin_settings(model) is tuned.seen[0]
        assert (tuned.seen[0].batch_size, tuned.seen[0].greeting) == (250, "hi")
    finally:
        await host.stop()
    assert "plugins.gone names no loaded plugin" in caplog.text


async def test_defaults_apply_without_a_section(tuned, migrated_database, tmp_path):
    host = await _start(_settings(migrated_database, tmp_path))
    try:
        assert (tuned.seen[0].batch_size, tuned.seen[0].greeting) == (100, "hello")
    finally:
        await host.stop()
