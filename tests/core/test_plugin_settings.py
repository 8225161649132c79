"""Plugin settings: a ``plugins.<name>`` section validated at start-up against the model the plugin registered."""

from __future__ import annotations

import importlib
import logging

import pytest

from factstream.errors import ConfigError

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
async def test_a_bad_value_stops_start_up_naming_the_plugin_and_the_key(tuned, host_cluster, section, message):
    with pytest.raises(ConfigError, match=r"invalid settings of plugin 'tuned': " + message):
        await host_cluster("main", plugins={"tuned": section})
    assert tuned.seen == []  # no hook ran


async def test_a_section_for_a_plugin_that_takes_no_settings_is_refused(tuned, host_cluster):
    with pytest.raises(ConfigError, match=r"plugins\.bare: plugin 'bare' takes no settings"):
        await host_cluster("main", plugins={"bare": {"x": 1}})


async def test_values_come_from_the_file_and_the_environment_overrides_them(tuned, host_cluster, caplog):
    environ = {"FACTSTREAM_PLUGINS__TUNED__BATCH_SIZE": "250"}
    plugins = {"tuned": {"batch_size": 5, "greeting": "hi"}, "gone": {}}
    with caplog.at_level(logging.WARNING, logger="factstream.host.facade"):
        host = await host_cluster("main", environ=environ, plugins=plugins)
    model = type(tuned.seen[0])
    assert host.api.plugin_settings(model) is tuned.seen[0]
    assert (tuned.seen[0].batch_size, tuned.seen[0].greeting) == (250, "hi")
    assert "plugins.gone names no loaded plugin" in caplog.text


async def test_defaults_apply_without_a_section(tuned, host_cluster):
    await host_cluster("main")
    assert (tuned.seen[0].batch_size, tuned.seen[0].greeting) == (100, "hello")
