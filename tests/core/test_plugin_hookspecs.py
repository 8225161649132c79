"""Hooks plugins define for other plugins (``register_hookspecs``), called with ``call_hook``/``call_first``
(given the spec function itself).

The in-process plugins below are objects added with ``PluginHost.add``, as ``load_plugins`` adds
discovered ones: ``policy`` defines two hooks, ``like_limit`` (firstresult, with its own ``trylast``
default) and ``like_tags``; the other plugins implement them. The last tests install the example of
docs/writing-plugins.md ("Hooks of your own") through entry points and call its hook in a running host.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

import factstream
from factstream.errors import PluginError
from factstream.plugin import core, hookspecs
from factstream.plugin.manager import CORE_PLUGIN, PluginHost, PluginSelection, load_plugins

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"


class PolicyHooks:
    """The hooks ``policy`` defines (static: callers pass ``PolicyHooks.like_limit`` to ``call_first``)."""

    @staticmethod
    @factstream.hookspec(firstresult=True)
    def like_limit(host, user, target):
        """How many likes ``target`` may get, or None to leave it to the next implementation."""

    @staticmethod
    @factstream.hookspec
    def like_tags(target):
        """Tags for ``target``; every implementation is asked."""


LIKE_LIMIT = PolicyHooks.like_limit
LIKE_TAGS = PolicyHooks.like_tags


class Policy:
    """Defines the hooks, and answers ``like_limit`` last (a default)."""

    @factstream.hookimpl
    def register_hookspecs(self, register):
        register(PolicyHooks)

    @factstream.hookimpl(trylast=True)
    def like_limit(self, target):
        return 100


class Strict:
    """Limits posts; says nothing of other targets. Takes only ``target`` of the three arguments."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @factstream.hookimpl(defined_by="policy")
    def like_limit(self, target):
        self.seen.append(target)
        return 5 if target.startswith("post:") else None


class Tagger:
    """Tags every target with its prefix (``tryfirst``) or its name."""

    def __init__(self, tag: str, *, tryfirst: bool = False) -> None:
        self.tag = tag
        marker = factstream.hookimpl(defined_by="policy", tryfirst=tryfirst)

        def like_tags(target):
            return None if self.tag == "none" else f"{self.tag}:{target}"

        self.like_tags = marker(like_tags)


def plugin_host(*plugins: tuple[str, object]) -> PluginHost:
    """The core and ``plugins``, added in order (the last added is called first, as in pluggy)."""
    host = PluginHost()
    host.add(CORE_PLUGIN, core)
    for name, plugin in plugins:
        host.add(name, plugin)
    return host


# -- defining and calling ---------------------------------------------------------------------------


async def test_a_hook_one_plugin_defines_is_implemented_by_others_and_called_in_hook_order():
    # "tagger" is added before "policy" defines the hook: the order of loading does not matter.
    host = plugin_host(
        ("tagger", Tagger("plain")),
        ("policy", Policy()),
        ("silent", Tagger("none")),
        ("first", Tagger("early", tryfirst=True)),
        ("late", Tagger("late")),
    )

    tags = await host.call_hook(LIKE_TAGS, target="post:1")

    assert host.hook_owners == {"like_limit": "policy", "like_tags": "policy"}
    # tryfirst, then the plugin added last first; "silent" answered None, which is dropped.
    assert tags == ["early:post:1", "late:post:1", "plain:post:1"]


async def test_call_first_returns_the_first_answer_and_the_trylast_default_only_when_none_answered():
    strict = Strict()
    # Without trylast, "policy", added last, would answer first: 100 for everything.
    host = plugin_host(("strict", strict), ("policy", Policy()))

    assert await host.call_first(LIKE_LIMIT, host=None, user="@a:hs", target="post:1") == 5
    assert await host.call_first(LIKE_LIMIT, host=None, user="@a:hs", target="page:1") == 100
    assert await host.call_hook(LIKE_LIMIT, host=None, user="@a:hs", target="post:2") == [5, 100]
    assert strict.seen == ["post:1", "page:1", "post:2"]  # it got the one argument it names


async def test_call_first_is_none_when_nothing_answers_and_stops_at_the_first_answer():
    asked = []

    class Quiet:
        @factstream.hookimpl(defined_by="policy")
        def like_limit(self, target):
            asked.append("quiet")

    class Sure:
        @factstream.hookimpl(defined_by="policy")
        def like_limit(self, target):
            asked.append("sure")
            return 0

    class Bare:  # defines the hooks without a default
        @factstream.hookimpl
        def register_hookspecs(self, register):
            register(PolicyHooks)

    assert await plugin_host(("policy", Bare()), ("quiet", Quiet())).call_first(LIKE_LIMIT, target="x") is None
    host = plugin_host(("policy", Bare()), ("sure", Sure()), ("quiet", Quiet()))
    assert await host.call_first(LIKE_LIMIT, target="x") == 0  # 0 is an answer; only None is not
    assert asked == ["quiet", "quiet", "sure"]
    assert await plugin_host(("policy", Bare())).call_hook(LIKE_TAGS, target="x") == []


async def test_coroutine_implementations_are_awaited_one_after_the_other():
    log = []

    class Slow:
        @factstream.hookimpl(defined_by="policy")
        async def like_tags(self, target):
            log.append("slow starts")
            await asyncio.sleep(0.01)
            log.append("slow ends")
            return f"slow:{target}"

    class Quick:
        @factstream.hookimpl(defined_by="policy")
        def like_tags(self, target):
            log.append("quick")
            return f"quick:{target}"

    class AsyncLimit:
        @factstream.hookimpl(defined_by="policy")
        async def like_limit(self, target):
            await asyncio.sleep(0)
            return 7 if target == "post:1" else None

    host = plugin_host(("quick", Quick()), ("slow", Slow()), ("policy", Policy()), ("async_limit", AsyncLimit()))

    assert await host.call_hook(LIKE_TAGS, target="t") == ["slow:t", "quick:t"]
    assert log == ["slow starts", "slow ends", "quick"]
    assert await host.call_first(LIKE_LIMIT, target="post:1") == 7
    assert await host.call_first(LIKE_LIMIT, target="post:2") == 100  # None awaited, then the default


async def test_the_implementations_are_resolved_once_and_again_when_a_plugin_is_added(monkeypatch):
    host = plugin_host(("policy", Policy()), ("tagger", Tagger("a")))
    lookups = []
    ordered = host._ordered_impls

    def counted(hook):
        lookups.append(hook)
        return ordered(hook)

    monkeypatch.setattr(host, "_ordered_impls", counted)

    assert await host.call_hook(LIKE_TAGS, target="t") == ["a:t"]
    assert await host.call_hook(LIKE_TAGS, target="u") == ["a:u"]
    assert lookups.count("like_tags") == 1

    host.add("other", Tagger("b"))

    assert await host.call_hook(LIKE_TAGS, target="t") == ["b:t", "a:t"]
    assert lookups.count("like_tags") == 2


# -- refused at start-up ------------------------------------------------------------------------------


class Shadow:
    """Defines ``startup``, a core hook."""

    class Hooks:
        @factstream.hookspec
        def startup(self, host):
            """A second startup."""

    @factstream.hookimpl
    def register_hookspecs(self, register):
        register(self.Hooks)


class Rival:
    """Defines ``like_limit`` too."""

    class Hooks:
        @factstream.hookspec(firstresult=True)
        def like_limit(self, target):
            """Another like_limit."""

    @factstream.hookimpl
    def register_hookspecs(self, register):
        register(self.Hooks)


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        (
            [("shadow", Shadow())],
            "duplicate hook 'startup': defined by both the core ('factstream') and plugin 'shadow'",
        ),
        (
            [("rival", Rival()), ("policy", Policy())],
            "duplicate hook 'like_limit': defined by both plugins 'policy' and 'rival'",
        ),
        (
            [("policy", Policy()), ("rival", Rival())],
            "duplicate hook 'like_limit': defined by both plugins 'policy' and 'rival'",
        ),
    ],
    ids=["core-hook", "plugin-hook", "plugin-hook-other-order"],
)
def test_a_hook_name_the_core_or_another_plugin_defines_is_refused_naming_both(plugins, message):
    host = plugin_host(*plugins)

    with pytest.raises(PluginError) as refused:
        host.resolve_hooks()

    assert str(refused.value) == message


def test_a_plugin_defining_a_hook_twice_or_registering_no_specs_is_refused():
    class Twice:
        @factstream.hookimpl
        def register_hookspecs(self, register):
            register(PolicyHooks)
            register(PolicyHooks)

    class NotSpecs:
        @factstream.hookimpl
        def register_hookspecs(self, register):
            register(Policy)

    with pytest.raises(PluginError, match=r"^duplicate hook 'like_limit': plugin 'twice' defined it twice$"):
        plugin_host(("twice", Twice())).resolve_hooks()
    with pytest.raises(PluginError, match=r"^plugin 'notspecs' registered .*Policy as hook specs, but it holds no"):
        plugin_host(("notspecs", NotSpecs())).resolve_hooks()


def test_no_hook_is_called_before_every_plugins_hooks_are_known():
    """Registration hooks and the registry wait for every plugin's register_hookspecs (and its checks)."""
    host = plugin_host(("policy", Policy()), ("shadow", Shadow()))

    with pytest.raises(PluginError, match=r"^duplicate hook 'startup'"):
        host.registry  # noqa: B018


def test_a_misspelt_implementation_of_a_plugin_hook_gets_the_hint():
    class Typo:
        @factstream.hookimpl
        def like_limt(self, target):
            return 1

    class TypoDeclared:
        @factstream.hookimpl(defined_by="policy")
        def like_limt(self, target):
            return 1

    with pytest.raises(PluginError) as plain:
        plugin_host(("typo", Typo()), ("policy", Policy())).resolve_hooks()
    with pytest.raises(PluginError) as declared:
        plugin_host(("policy", Policy()), ("typo", TypoDeclared())).resolve_hooks()

    assert str(plain.value).startswith(
        "plugin 'typo' implements unknown hook 'like_limt' (did you mean 'like_limit', defined by plugin 'policy'?); "
        "known hooks: register_caches, register_command_handlers, register_commands, register_export_jobs"
    )
    assert str(plain.value).endswith("; hooks defined by plugins: like_limit ('policy'), like_tags ('policy')")
    assert str(declared.value) == (
        "plugin 'typo' implements hook 'like_limt' of plugin 'policy', which 'policy' does not define "
        "(did you mean 'like_limit'?); hooks of 'policy': like_limit, like_tags"
    )


def test_an_implementation_with_an_argument_the_plugin_hook_lacks_is_refused_naming_it():
    class Colour:
        @factstream.hookimpl(defined_by="policy")
        def like_limit(self, target, colour):
            return 1

    with pytest.raises(PluginError, match=r"^plugin 'colour' has an invalid hook implementation: .*'colour'"):
        plugin_host(("colour", Colour()), ("policy", Policy())).resolve_hooks()


def test_implementing_another_plugins_hook_requires_naming_that_plugin():
    class Undeclared:
        @factstream.hookimpl
        def like_limit(self, target):
            return 1

    class Misattributed:
        @factstream.hookimpl(defined_by="rival")
        def like_limit(self, target):
            return 1

    with pytest.raises(PluginError) as undeclared:
        plugin_host(("policy", Policy()), ("undeclared", Undeclared())).resolve_hooks()
    with pytest.raises(PluginError) as misattributed:
        plugin_host(("policy", Policy()), ("mis", Misattributed())).resolve_hooks()

    assert str(undeclared.value) == (
        "plugin 'undeclared' implements hook 'like_limit' of plugin 'policy': mark it "
        "@factstream.hookimpl(defined_by='policy'), so that where 'policy' is not loaded it is ignored "
        "rather than refused as an unknown hook"
    )
    assert str(misattributed.value) == (
        "plugin 'mis' implements hook 'like_limit' as a hook of plugin 'rival' (defined_by), "
        "but plugin 'policy' defines it"
    )


@pytest.mark.parametrize("absent", ["blocked", "not installed"])
async def test_an_implementation_of_a_hook_whose_plugin_is_not_loaded_is_ignored_with_one_warning(absent, caplog):
    extra = [("strict", Strict()), ("tagger", Tagger("a"))]
    if absent == "blocked":
        extra.append(("policy", Policy()))
    selection = PluginSelection(only=frozenset(), blocked=frozenset({"policy"}))

    with caplog.at_level(logging.WARNING, logger="factstream.plugin.manager"):
        host = load_plugins(selection, extra=extra)
        host.resolve_hooks()
        host.registry  # noqa: B018 (the other hooks run)
        host.add("late", Tagger("b"))
        host.resolve_hooks()  # checks names again: no second warning for the same implementation

    assert "policy" not in host.plugins
    assert [r.getMessage() for r in caplog.records] == [
        f"plugin {name!r} implements hook {hook!r} of plugin 'policy', which is not loaded (blocked or not "
        "installed); the implementation is ignored"
        for name, hook in [("strict", "like_limit"), ("tagger", "like_tags"), ("late", "like_tags")]
    ]
    assert host.ignored == {("strict", "like_limit"), ("tagger", "like_tags"), ("late", "like_tags")}
    with pytest.raises(KeyError, match=r"no loaded plugin defines hook 'like_limit'; no plugin defines hooks"):
        await host.call_first(LIKE_LIMIT, target="post:1")


# -- errors when calling ------------------------------------------------------------------------------


class Broken:
    @factstream.hookimpl(defined_by="policy")
    def like_limit(self, target):
        raise ValueError(f"no limit for {target}")


class BrokenAsync:
    @factstream.hookimpl(defined_by="policy")
    async def like_limit(self, target):
        await asyncio.sleep(0)
        raise ValueError(f"no limit for {target}")


@pytest.mark.parametrize("broken", [Broken, BrokenAsync])
async def test_an_implementation_that_raises_stops_the_call_with_an_error_naming_the_plugin_and_hook(broken):
    strict = Strict()
    host = plugin_host(("strict", strict), ("policy", Policy()), ("broken", broken()))

    for call in (host.call_first, host.call_hook):
        with pytest.raises(PluginError) as failed:
            await call(LIKE_LIMIT, target="post:1")
        assert str(failed.value) == "plugin 'broken' failed in hook like_limit: ValueError: no limit for post:1"
        assert isinstance(failed.value.__cause__, ValueError)
    assert strict.seen == []  # the call stopped at the failure


class Misspelt:
    """A spec no plugin registers, named like one that ``policy`` does."""

    @staticmethod
    @factstream.hookspec(firstresult=True)
    def like_limt(target):
        """Misspelt."""


async def test_a_hook_no_plugin_defines_or_a_core_hook_is_a_key_error():
    host = plugin_host(("policy", Policy()))

    with pytest.raises(KeyError) as unknown:
        await host.call_first(Misspelt.like_limt, target="x")
    with pytest.raises(KeyError) as core_hook:
        await host.call_hook(hookspecs.startup, host=None)

    assert unknown.value.args[0] == (
        "no loaded plugin defines hook 'like_limt' (did you mean 'like_limit', defined by plugin 'policy'?); "
        "hooks defined by plugins: like_limit ('policy'), like_tags ('policy')"
    )
    assert core_hook.value.args[0].startswith("hook 'startup' is a core hook, which only the host calls")


async def test_a_function_that_is_not_a_hook_spec_is_refused_and_positional_arguments_take_the_specs_names():
    strict = Strict()
    host = plugin_host(("strict", strict), ("policy", Policy()))

    def like_limit(host, user, target):
        """Not marked ``@factstream.hookspec``."""

    with pytest.raises(TypeError, match=r"call_hook and call_first take a @factstream.hookspec function"):
        await host.call_first(like_limit, None, "@a:hs", "post:1")
    assert await host.call_first(LIKE_LIMIT, None, "@a:hs", target="post:1") == 5
    assert strict.seen == ["post:1"]


def test_defined_by_must_name_a_plugin():
    with pytest.raises(ValueError, match=r"defined_by must name the plugin that defines the hook, not ''"):
        factstream.hookimpl(defined_by="")


# -- the guide's example, in a running host ------------------------------------------------------------


def guide_examples() -> dict[str, str]:
    """The plugins of the guide's "Hooks of your own": ``<!-- hooks-example: NAME -->`` then a python block."""
    found = re.findall(r"^<!-- hooks-example: (\w+) -->\n```python\n(.*?)^```$", GUIDE.read_text(), re.M | re.S)
    return dict(found)


@pytest.fixture
def signup(plugin_installer):
    """The guide's two plugins, installed through their entry points: ``signup`` and ``reserved_names``."""
    examples = guide_examples()
    assert sorted(examples) == ["reserved_names", "signup"]
    for name, source in examples.items():
        plugin_installer.from_source(name, source)


async def test_register_hookspecs_of_the_guide_answers_through_a_route_and_the_host_api(signup, host_cluster):
    main = await host_cluster("main")
    client = host_cluster.client(main)

    answers = {name: (await client.get(f"/signup/check/{name}")).json()["refused"] for name in ("admin", "al", "alice")}

    assert answers == {
        "admin": "'admin' is reserved",  # reserved_names answered first
        "al": "a username is 3 to 20 characters",  # nobody else did: the trylast default of signup
        "alice": None,
    }
    from factstream_signup import SignupHooks

    check_username = SignupHooks.check_username
    assert await main.api.call_first(check_username, host=main.api, username="root") == "'root' is reserved"
    assert await main.api.call_hook(check_username, host=main.api, username="al") == [
        "a username is 3 to 20 characters"
    ]
    assert main.plugins.hook_owners == {"check_username": "signup"}
