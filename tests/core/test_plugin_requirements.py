"""Plugins that need other plugins (``register_requirements``): a host without a required plugin does not
start and says which and why; a required plugin's hooks run first (its ``shutdown`` last); loops and
malformed requirements are refused by name.

The plugins are real entry-point plugins (``plugin_installer``). Plugins load by name, and pluggy calls
the last loaded first, so without a requirement ``needy`` is called before ``base``: every order asserted
here is the one the requirement imposes.
"""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess

import pytest

from factstream import PluginError, RequirementSpec
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster, PluginInstaller

#: A plugin that logs each hook it runs into the list it is handed (the ``host`` argument of the test's calls).
LOGGING = """
import factstream
from factstream import CacheSpec, RequirementSpec

@factstream.hookimpl
def register_requirements(register):
    {requirements}

@factstream.hookimpl
def register_caches(register):
    register(CacheSpec(name="{name}_cache", max_size=10))

@factstream.hookimpl
def startup(host):
    host.append(("startup", "{name}"))

@factstream.hookimpl
def shutdown(host):
    host.append(("shutdown", "{name}"))
"""


def install(plugin_installer: PluginInstaller, name: str, *needs: tuple[str, str]) -> None:
    lines = [f"register(RequirementSpec(plugin={plugin!r}, reason={reason!r}))" for plugin, reason in needs] or ["pass"]
    plugin_installer.from_source(name, LOGGING.format(name=name, requirements="\n    ".join(lines)))


async def test_a_required_plugin_s_hooks_run_first_and_its_shutdown_last(plugin_installer: PluginInstaller) -> None:
    install(plugin_installer, "base")
    install(plugin_installer, "needy", ("base", "its rows go to base's rooms"))
    host = plugin_installer.plugin_host(only_installed=True)

    assert host.requirements == {"needy": [RequirementSpec("base", "its rows go to base's rooms")]}
    calls: list[tuple[str, str]] = []
    await host.startup(calls)
    assert await host.shutdown(calls) == []
    assert calls == [("startup", "base"), ("startup", "needy"), ("shutdown", "needy"), ("shutdown", "base")]
    assert [c.spec.name for c in host.registry.caches] == ["base_cache", "needy_cache"]


async def test_without_a_requirement_the_order_is_pluggy_s(plugin_installer: PluginInstaller) -> None:
    """The control of the test above: the same two plugins, no requirement, the other order."""
    install(plugin_installer, "base")
    install(plugin_installer, "needy")
    host = plugin_installer.plugin_host(only_installed=True)
    calls: list[tuple[str, str]] = []
    await host.startup(calls)
    assert calls == [("startup", "needy"), ("startup", "base")]


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({}, "is not installed: install its distribution into this environment (uv pip install, or uv sync)"),
        (
            {"FACTSTREAM_BLOCK_PLUGINS": "base"},
            "is blocked by FACTSTREAM_BLOCK_PLUGINS: unblock it, or block 'needy' too",
        ),
        ({"FACTSTREAM_LOAD_PLUGINS": "needy"}, "is not named in FACTSTREAM_LOAD_PLUGINS: name it there too"),
    ],
    ids=["not installed", "blocked", "not selected"],
)
def test_a_missing_required_plugin_is_refused_naming_both_the_reason_and_why_it_is_missing(
    plugin_installer: PluginInstaller, environ: dict[str, str], why: str
) -> None:
    if environ:
        install(plugin_installer, "base")
    install(plugin_installer, "needy", ("base", "its rows go to base's rooms"))
    host = load_plugins(environ=environ)
    with pytest.raises(PluginError) as refused:
        _ = host.registry
    assert str(refused.value) == f"plugin 'needy' needs plugin 'base' (its rows go to base's rooms), which {why}"


async def test_a_host_without_a_required_plugin_does_not_start(
    plugin_installer: PluginInstaller, host_cluster: HostCluster
) -> None:
    install(plugin_installer, "needy", ("nowhere", "it reads nowhere's tables"))
    with pytest.raises(PluginError, match=r"plugin 'needy' needs plugin 'nowhere' \(it reads nowhere's tables\)"):
        await host_cluster("main")


def test_every_command_says_what_is_missing_without_a_traceback(
    plugin_installer: PluginInstaller, cli: Callable[..., CompletedProcess[str]]
) -> None:
    install(plugin_installer, "needy", ("nowhere", "it reads nowhere's tables"))
    for args in (["plugins"], ["migrate", "status"]):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert (
            "plugin 'needy' needs plugin 'nowhere' (it reads nowhere's tables), which is not installed" in done.stderr
        )
        assert "Traceback" not in done.stdout + done.stderr


def test_requirements_that_loop_are_refused_naming_the_loop(plugin_installer: PluginInstaller) -> None:
    install(plugin_installer, "alpha", ("beta", "b"))
    install(plugin_installer, "beta", ("gamma", "c"))
    install(plugin_installer, "gamma", ("alpha", "a"))
    host = plugin_installer.plugin_host(only_installed=True)
    with pytest.raises(PluginError, match=r"plugins need each other in a loop \(alpha -> beta -> gamma -> alpha\)"):
        _ = host.registry


@pytest.mark.parametrize(
    ("registered", "message"),
    [
        (
            "register(CacheSpec(name='x', max_size=1))",
            "registered CacheSpec(.*) in register_requirements, which takes a",
        ),
        ("register(RequirementSpec(plugin='needy', reason='me'))", "plugin 'needy' registered a requirement on itself"),
        ("register(RequirementSpec(plugin=' base', reason='r'))", "names a plugin by its entry-point name"),
        ("register(RequirementSpec(plugin='base', reason=' '))", "needs a reason"),
    ],
    ids=["another spec", "itself", "a bad name", "no reason"],
)
def test_a_malformed_requirement_is_refused_naming_the_plugin(
    plugin_installer: PluginInstaller, registered: str, message: str
) -> None:
    install(plugin_installer, "base")
    plugin_installer.from_source(
        "needy",
        "import factstream\nfrom factstream import CacheSpec, RequirementSpec\n\n"
        f"@factstream.hookimpl\ndef register_requirements(register):\n    {registered}\n",
    )
    host = plugin_installer.plugin_host(only_installed=True)
    with pytest.raises(PluginError, match=message) as refused:
        _ = host.registry
    assert "needy" in str(refused.value)


def test_factstream_plugins_lists_what_each_plugin_needs(
    plugin_installer: PluginInstaller, cli: Callable[..., CompletedProcess[str]]
) -> None:
    install(plugin_installer, "base")
    install(plugin_installer, "needy", ("base", "its rows go to base's rooms"))
    done = cli("plugins")
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.count("│") > 2}
    assert rows["needy"].rstrip(" │").endswith("base"), rows["needy"]
    assert rows["base"].rstrip(" │").endswith("-"), rows["base"]
