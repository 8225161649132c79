"""The events plugin's caches are the host's named caches: listed in ``host.caches``, counted on ``/metrics``."""

from __future__ import annotations

import re

from factstream_events.shared.caches import IMMUTABLE_CACHES

from tests.bundled.events.conftest import store_of

IMMUTABLE = [spec.name for spec in IMMUTABLE_CACHES]
#: Sized in one place: 100,000 entries, half that for the client forms of events (hundreds of bytes each).
SIZES = {name: 50_000 if name == "events_client_bodies" else 100_000 for name in IMMUTABLE}


def lookups(metrics: str, cache: str) -> float:
    """Hits and misses of ``cache`` on host ``main``, as ``/metrics`` reports them."""
    found = re.findall(rf'factstream_cache_(?:hits|misses)_total\{{cache="{cache}",instance="main"\}} (\S+)', metrics)
    assert len(found) == 2, f"no hits and misses of {cache} on /metrics"
    return sum(map(float, found))


async def test_the_caches_of_immutable_facts_are_in_host_caches_and_on_metrics(main, client, host_cluster):
    assert set(IMMUTABLE) == {
        "events_room_versions",
        "events_member_event_membership",
        "events_replaces_state",
        "events_member_at_group",
        "events_state_contents",
        "events_room_creators",
        "events_client_bodies",
    }
    assert set(IMMUTABLE) <= set(main.api.caches.names())
    metrics = (await host_cluster.client(main).get("/metrics")).text
    before = {name: lookups(metrics, name) for name in IMMUTABLE}

    room = await store_of(main).create_room("@alice:hs", preset="public_chat", name="Lobby")
    await store_of(main).send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "hello"})
    alice = client("@alice:hs")
    assert (await alice.get(f"/rooms/{room}/messages", params={"dir": "b"})).status_code == 200
    assert (await alice.get(f"/rooms/{room}/state")).status_code == 200

    metrics = (await host_cluster.client(main).get("/metrics")).text
    used = {name for name in IMMUTABLE if lookups(metrics, name) > before[name]}
    # The reads and the store look up through the registered caches, not caches of their own.
    assert {"events_room_versions", "events_member_event_membership", "events_state_contents"} <= used, used
    for name in IMMUTABLE:
        assert f'factstream_cache_size{{cache="{name}",instance="main"}}' in metrics
        assert main.api.caches.get(name).max_size == SIZES[name]
