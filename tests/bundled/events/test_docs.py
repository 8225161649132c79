"""docs/plugins/events.md stays the complete documentation of the events plugin.

The static checks need no database: every route, setting, hook (with its exact signature), public
method of the Python API, table and error of the plugin is named in the page, its internal links
resolve, and no part-1 feature is described as missing. The examples the page marks with
``<!-- test_docs: NAME -->`` are run against a real host: the Python API example, and the two hook
examples registered as a plugin would register them.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from factstream_events import EventsStore, hookspecs
from factstream_events.migrations import events_0001_create
from factstream_events.read.reads import Reads
from factstream_events.read.timeline import Timeline
from factstream_events.routes import ROUTES
from factstream_events.rules.errors import EventsError, Forbidden
from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.shared.settings import EventsSettings
from factstream_events.store import RemoteEvent

from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster

from .conftest import TOKENS, store_of, token_of

ROOT = Path(__file__).resolve().parents[3]
DOC_PATH = ROOT / "docs" / "plugins" / "events.md"
DOC = DOC_PATH.read_text(encoding="utf-8")


# -- what the page names ---------------------------------------------------------------------------------


def test_the_page_does_not_call_any_feature_missing() -> None:
    assert "not built yet" not in DOC.lower()


@pytest.mark.parametrize(
    ("method", "path"),
    [(method, route.path) for route in ROUTES for method in route.methods],
    ids=lambda value: str(value),
)
def test_every_route_is_documented_with_its_method(method: str, path: str) -> None:
    assert f"{method} {path}" in DOC, f"docs/plugins/events.md does not document `{method} {path}`"


@pytest.mark.parametrize("field", list(EventsSettings.model_fields))
def test_every_setting_is_documented_with_its_environment_variable(field: str) -> None:
    assert f"`{field}`" in DOC, f"the setting plugins.events.{field} is not documented"
    variable = f"FACTSTREAM_PLUGINS__EVENTS__{field.upper()}"
    assert variable in DOC, f"the environment variable {variable} is not documented"


def _hookspecs() -> dict[str, Callable[..., Any]]:
    return {
        name: function
        for name, function in vars(hookspecs).items()
        if inspect.isfunction(function) and getattr(function, "factstream_spec", None) is not None
    }


def _signature_line(name: str, function: Callable[..., Any]) -> str:
    """``def name(a: T, ...) -> R``, with the annotations as written in the hook spec."""
    signature = inspect.signature(function)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


def test_the_plugin_defines_hooks() -> None:
    assert set(_hookspecs()) >= {"resolve_state", "check_local_event"}


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_every_hook_is_documented_with_its_exact_signature(name: str) -> None:
    function = _hookspecs()[name]
    assert f"### `{name}`" in DOC, f"the hook {name} has no section"
    assert _signature_line(name, function) in DOC, f"the hook spec of {name} is not shown as it is"
    call = f"`{name}({', '.join(inspect.signature(function).parameters)})`"
    assert call in DOC, f"the page does not say how {name} is called: {call}"
    section = DOC.split(f"### `{name}`", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    assert f'@factstream.hookimpl(defined_by="events")\ndef {name}(' in section, f"the hook {name} has no example"


def _public_methods(cls: type) -> list[str]:
    """The public methods of ``cls``, ``@cached`` ones included (a descriptor wrapping a function)."""
    return sorted(
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and (callable(value) or inspect.isfunction(getattr(value, "fn", None)))
    )


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls in (EventsStore, Reads, Timeline) for name in _public_methods(cls)],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_every_public_method_of_the_python_api_is_documented(cls: type, name: str) -> None:
    assert re.search(rf"`(?:[\w.]+\.)?{re.escape(name)}\(", DOC), (
        f"{cls.__name__}.{name} is not documented (as `{name}(...)`)"
    )


def test_the_python_api_has_methods_to_check() -> None:
    assert {"create_room", "persist_remote"} <= set(_public_methods(EventsStore))
    assert {"messages", "backfill", "event"} <= set(_public_methods(Reads))
    assert {"new_events", "recent", "rooms_for_user"} <= set(_public_methods(Timeline))


def _tables() -> list[str]:
    """The plugin's tables: those its migration's downgrade drops."""
    source = inspect.getsource(events_0001_create.downgrade)
    return re.findall(r'"([a-z_]+)",', source)


def test_every_table_is_documented() -> None:
    tables = _tables()
    assert "events" in tables and "state_groups" in tables
    missing = [table for table in tables if f"`{table}`" not in DOC]
    assert not missing, f"tables not documented: {missing}"


@pytest.mark.parametrize("error", EventsError.__subclasses__(), ids=lambda e: e.__name__)
def test_every_error_status_and_code_is_documented(error: type[EventsError]) -> None:
    assert f"| {error.status} | `{error.errcode}` |" in DOC, f"{error.__name__}: {error.status} {error.errcode}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFC", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    body = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", body, flags=re.M)}


def test_every_link_of_the_page_resolves() -> None:
    own = _anchors(DOC)
    body = re.sub(r"```.*?```", "", DOC, flags=re.S)
    broken: list[str] = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in own:
                broken.append(target)
            continue
        file = (DOC_PATH.parent / path).resolve()
        if not file.exists() or (anchor and anchor not in _anchors(file.read_text(encoding="utf-8"))):
            broken.append(target)
    assert not broken, f"links that do not resolve: {broken}"


# -- the examples the page marks run as shown ------------------------------------------------------------


def example(name: str) -> str:
    """The code block right after ``<!-- test_docs: NAME -->``."""
    match = re.search(rf"<!-- test_docs: {re.escape(name)} -->\n```python\n(.*?)```", DOC, flags=re.S)
    assert match is not None, f"docs/plugins/events.md has no example marked {name!r}"
    return match.group(1)


def as_module(name: str) -> types.ModuleType:
    module = types.ModuleType(f"events_docs_{name.replace('-', '_')}")
    exec(compile(example(name), f"{DOC_PATH}:{name}", "exec"), module.__dict__)
    return module


def test_every_marked_example_compiles() -> None:
    names = re.findall(r"<!-- test_docs: ([\w-]+) -->", DOC)
    assert set(names) == {"python-api", "resolve-state", "check-local-event"}
    for name in names:
        as_module(name)


ALICE, BOB = "@alice:hs", "@bob:hs"


async def test_the_python_api_example_runs(main) -> None:
    welcome = as_module("python-api").welcome
    chunk = [json.loads(event) for event in await welcome(main.api, ALICE)]
    assert [event["type"] for event in chunk] == ["m.room.message", "m.room.name", "m.room.history_visibility"]
    assert chunk[0]["content"]["body"] == "hello"
    assert all(event["unsigned"]["membership"] == "join" for event in chunk)


@pytest.fixture
async def with_doc_hooks(host_cluster: HostCluster):
    """A host with the page's two hook examples installed as plugins, beside the events plugin."""
    extra = [
        ("docs_resolve_state", as_module("resolve-state")),
        ("docs_check_local_event", as_module("check-local-event")),
    ]
    host_cluster.configure(plugin_host=lambda: load_plugins(extra=extra), http={"tokens": TOKENS})
    return await host_cluster("main")


async def test_the_check_local_event_example_refuses_links_in_public_rooms_only(host_cluster, with_doc_hooks) -> None:
    store = store_of(with_doc_hooks)
    public = await store.create_room(ALICE, preset="public_chat")
    private = await store.create_room(ALICE, preset="private_chat")
    link = {"msgtype": "m.text", "body": "see https://example.org"}
    with pytest.raises(Forbidden, match="links are not allowed in public rooms"):
        await store.send(public, ALICE, "m.room.message", link)
    await store.send(private, ALICE, "m.room.message", link)
    await store.send(public, ALICE, "m.room.message", {"msgtype": "m.text", "body": "no link"})
    # the default policy still decides the rest
    with pytest.raises(Forbidden, match="not in the room"):
        await store.send(private, BOB, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    answer = await host_cluster.client(with_doc_hooks, token_of(ALICE)).put(
        f"/rooms/{public}/send/m.room.message/t1", content=msgspec.json.encode(link)
    )
    assert answer.status_code == 403
    assert answer.json() == {"errcode": "M_FORBIDDEN", "error": "links are not allowed in public rooms"}


def remote(room_id: str, event_type: str, content: dict[str, Any], prev: list[str], depth: int, state_key=None):
    event: dict[str, Any] = {
        "room_id": room_id, "type": event_type, "sender": "@zed:elsewhere", "content": content,
        "prev_events": prev, "depth": depth, "origin_server_ts": 1_000 + depth, "auth_events": [],
    }  # fmt: skip
    if state_key is not None:
        event["state_key"] = state_key
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, "10")


async def forked_room(store: EventsStore, room_id: str) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """create, join, then a topic (depth 3) beside a name (depth 3) and a message after it (depth 4),
    joined by a message (depth 5): the state before the join event, and the IDs."""
    create, c = remote(room_id, "m.room.create", {"room_version": "10"}, [], 1, "")
    join, j = remote(room_id, "m.room.member", {"membership": "join"}, [c], 2, "@zed:elsewhere")
    topic, t = remote(room_id, "m.room.topic", {"topic": "a"}, [j], 3, "")
    name, n = remote(room_id, "m.room.name", {"name": "b"}, [j], 3, "")
    deeper, d = remote(room_id, "m.room.message", {"body": "deeper"}, [n], 4)
    merge, m = remote(room_id, "m.room.message", {"body": "merge"}, [t, d], 5)
    events = [create, join, topic, name, deeper, merge]
    await store.persist_remote(room_id, [RemoteEvent(msgspec.json.encode(e)) for e in events])
    return await store.reads.state_ids(room_id, at=m), {"topic": t, "name": n}


async def test_the_resolve_state_example_decides_forks_in_its_rooms_only(with_doc_hooks) -> None:
    store = store_of(with_doc_hooks)
    ours, ids = await forked_room(store, "!fork:example.org")
    assert ("m.room.name", "") in ours and ours[("m.room.name", "")] == ids["name"]
    assert ("m.room.topic", "") not in ours  # the deepest branch (the name's) won outright
    theirs, ids = await forked_room(store, "!fork:elsewhere")
    assert theirs[("m.room.topic", "")] == ids["topic"] and theirs[("m.room.name", "")] == ids["name"]  # the union


async def test_without_the_example_forks_keep_every_key(main) -> None:
    state, ids = await forked_room(store_of(main), "!fork:example.org")
    assert state[("m.room.topic", "")] == ids["topic"] and state[("m.room.name", "")] == ids["name"]
