"""Privacy is correctness (docs/plugins/presence.md, Privacy): a user sees the presence of themself and
of the users who share a room with them now; once they stop sharing one (a leave), later changes no
longer reach them. Checked against one small model, :func:`visible`, over generated memberships, leaves,
who changes and who asks (hypothesis), through ``/sync`` (initial and incremental) and ``GET
/presence/{user}/status`` on one real host reused across examples; and on the wake-up side: a long poll
of a user who may see a change wakes at once, one who may not waits for its whole timeout."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import pytest
from factstream_presence import PresenceStore, PresenceWriter
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS, USERS, clients_of, store_of
from tests.bundled.presence.conftest import Clients, get_status, presence_in, put_status, shared_room, sync

PEOPLE = USERS[:4]
ALICE, BOB, CAROL, DAVE = PEOPLE
#: Nobody times out during these tests: every change is a status the test sets.
SLOW_TIMEOUTS = {"sync_online_timeout_ms": 600_000, "check_interval_ms": 100}
_messages = itertools.count()


def visible(asker: str, user: str, rooms: list[frozenset[str]]) -> bool:
    """The model: oneself, and anyone sharing a room now."""
    return asker == user or any(asker in members and user in members for members in rooms)


@pytest.fixture
async def quiet_main(host_cluster: HostCluster) -> Host:
    """``main`` with the timeouts of :data:`SLOW_TIMEOUTS`, every user online (so that the reporter's
    ``USER_SYNC`` of a user's ``/sync`` changes nothing visible)."""
    host_cluster.configure(http={"tokens": TOKENS}, plugins={"presence": SLOW_TIMEOUTS})
    main = await host_cluster("main")
    for user in PEOPLE:
        await main.api.state(PresenceWriter).user_sync("main", user, True)
    return main


@pytest.fixture
def quiet_client(host_cluster: HostCluster, quiet_main: Host) -> Clients:
    return clients_of(host_cluster, quiet_main)


async def check_reads(
    host: Host, client: Clients, changer: str, message: str, since: dict[str, str], rooms: Any
) -> None:
    """Every asker's incremental and initial ``/sync`` and ``GET`` of everyone, against the model."""
    for asker in PEOPLE:
        http = client(asker)
        case = f"{changer} changed, {asker} asks, rooms {[sorted(r) for r in rooms]}"
        for kind, body in (("incremental", await sync(http, since[asker])), ("initial", await sync(http))):
            if asker == changer:
                continue  # one's own change wakes nothing of one's own: it comes with a later answer (GET below)
            shown = presence_in(body)
            if not all(visible(asker, user, rooms) for user in shown):
                sharing = sorted(await host.api.state(PresenceStore).visible_to(asker))
                raise AssertionError(f"{case}: {kind} /sync shows {sorted(shown)}; visible_to says {sharing}")
            assert (changer in shown) == visible(asker, changer, rooms), case
            if changer in shown:
                assert shown[changer]["status_msg"] == message, case
        for user in PEOPLE:
            response = await get_status(http, user)
            assert response.status_code == (200 if visible(asker, user, rooms) else 404), f"{case}, GET {user}"


memberships = st.lists(st.sets(st.sampled_from(PEOPLE), min_size=1), min_size=1, max_size=2)


#: Each example is round trips to a real host: no deadline, and no shrinking (a failing case is printed whole).
EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate)
)


@pytest.mark.xfail(
    strict=False,
    reason="open bug (issue 46's note): in about one run in four a user still sees the presence of someone "
    "they stopped sharing a room with, for long; suspected: a membership cache refilled with a read that "
    "began before the leave committed",
)
@EXAMPLES
@given(memberships, st.data())
async def test_sync_and_get_show_exactly_what_the_model_allows_before_and_after_leaves(
    quiet_main: Host, quiet_client: Clients, members: list[set[str]], data: st.DataObject
) -> None:
    store = store_of(quiet_main)
    ordered = [sorted(m) for m in members]
    room_ids = [await shared_room(quiet_main, *m) for m in ordered]
    rooms = [frozenset(m) for m in members]
    leaves = data.draw(st.sets(st.sampled_from([(i, u) for i, m in enumerate(ordered) for u in m])), "leaves")
    try:
        for step in ("before the leaves", "after the leaves"):
            changer = data.draw(st.sampled_from(PEOPLE), f"who changes {step}")
            since = {u: (await sync(quiet_client(u)))["next_batch"] for u in PEOPLE}
            message = f"status {next(_messages)}"
            body = {"presence": "online", "status_msg": message}
            assert (await put_status(quiet_client(changer), changer, body)).status_code == 200
            await check_reads(quiet_main, quiet_client, changer, message, since, rooms)
            if step == "before the leaves":
                for i, user in sorted(leaves):
                    await store.change_membership(room_ids[i], user, user, "leave")
                rooms = [frozenset(m - {u for i2, u in leaves if i2 == i}) for i, m in enumerate(rooms)]
    finally:  # nobody shares these rooms with anyone in the next example
        for i, room in enumerate(room_ids):
            for user in sorted(rooms[i]):
                await store.change_membership(room, user, user, "leave")


async def timed_poll(http: Any, since: str, timeout_ms: int) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    body = await sync(http, since, timeout=timeout_ms)
    return body, time.monotonic() - started


async def test_a_change_wakes_exactly_the_long_polls_of_those_who_may_see_it(
    quiet_main: Host, quiet_client: Clients
) -> None:
    room = await shared_room(quiet_main, ALICE, BOB, DAVE)
    await store_of(quiet_main).change_membership(room, DAVE, DAVE, "leave")  # dave shared a room once
    clients = {user: quiet_client(user) for user in PEOPLE}
    for http in clients.values():
        http.timeout = httpx.Timeout(10)
    since = {user: (await sync(http))["next_batch"] for user, http in clients.items()}
    polls = {user: asyncio.create_task(timed_poll(http, since[user], 2_000)) for user, http in clients.items()}
    await asyncio.sleep(0.5)
    assert not any(p.done() for p in polls.values()), "nothing happened yet: every long poll must wait"
    assert (await put_status(clients[BOB], BOB, {"presence": "online", "status_msg": "wake"})).status_code == 200
    for user, poll in polls.items():
        body, took = await poll
        allowed = visible(user, BOB, [frozenset({ALICE, BOB})]) and user != BOB  # not one's own long poll
        assert (BOB in presence_in(body)) == allowed, user
        # a woken poll answers at once; one that is not woken waits for its whole timeout
        assert (took < 1.4) == allowed, f"{user}: answered after {took:.2f} s"
