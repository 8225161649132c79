"""The notifier: who is woken, with which token, how long waits last, and what it costs."""

from __future__ import annotations

import asyncio

import pytest

from factstream.sync import Notifier, StreamToken, SyncKeyLayout
from factstream.sync.notifier import WAKEUPS
from factstream.testing import until

LAYOUT = SyncKeyLayout.of("facts_key", "other_key")


class Clock:
    """The host's current token, moved by hand."""

    def __init__(self) -> None:
        self.token = StreamToken.start(LAYOUT)
        self.reads = 0

    def __call__(self) -> StreamToken:
        self.reads += 1
        return self.token

    def advance(self, key: str = "facts_key") -> StreamToken:
        self.token = self.token.copy_and_advance(key, int(self.token.get(key)) + 1)  # type: ignore[arg-type]
        return self.token


class Recorder:
    """A sync callback: returns the facts in ``(prev, current]`` that ``results`` says exist."""

    def __init__(self, results: list[list[str]] | None = None) -> None:
        self.calls: list[tuple[StreamToken, StreamToken]] = []
        self.results = results or []

    async def __call__(self, prev: StreamToken, current: StreamToken) -> list[str]:
        self.calls.append((prev, current))
        return self.results.pop(0) if self.results else ["something"]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def notifier(clock: Clock) -> Notifier:
    return Notifier(clock)


async def test_a_wait_is_woken_by_an_event_for_its_user(clock, notifier):
    since = clock.token
    callback = Recorder()
    task = asyncio.create_task(notifier.wait_for_events("@alice", since, 10, callback))
    await until(lambda: notifier.open_waits == 1, 5.0)
    assert callback.calls == []

    new = clock.advance()
    assert notifier.on_new_event("facts_key", 1, users=["@alice"]) == 1

    result = await task
    assert result.result == ["something"]
    assert result.next_token == new
    assert callback.calls == [(since, new)]
    assert notifier.open_waits == 0


async def test_a_wait_is_woken_through_a_room_the_user_is_in(clock, notifier):
    notifier.set_user_rooms("@alice", ["!room"])
    task = asyncio.create_task(notifier.wait_for_events("@alice", clock.token, 10, Recorder()))
    await until(lambda: notifier.open_waits == 1, 5.0)
    clock.advance()
    assert notifier.on_new_event("facts_key", rooms=["!elsewhere"]) == 0
    assert notifier.on_new_event("facts_key", rooms=["!room"]) == 1
    assert (await task).result == ["something"]


async def test_leaving_a_room_stops_its_wake_ups(clock, notifier):
    notifier.set_user_rooms("@alice", ["!a", "!b"])
    notifier.set_user_rooms("@alice", ["!b"])
    assert notifier.user_rooms("@alice") == {"!b"}
    task = asyncio.create_task(notifier.wait_for_events("@alice", clock.token, 0.2, Recorder()))
    await until(lambda: notifier.open_waits == 1, 5.0)
    assert notifier.on_new_event("facts_key", rooms=["!a"]) == 0
    notifier.forget_user("@alice")
    assert notifier.on_new_event("facts_key", rooms=["!b"]) == 0
    assert (await task).timed_out


async def test_a_timeout_returns_an_empty_result_and_the_token_it_started_from(clock, notifier):
    since = clock.token
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await notifier.wait_for_events("@alice", since, 0.1, Recorder())
    assert loop.time() - started >= 0.09
    assert result.result is None and result.timed_out
    assert result.next_token == since


async def test_the_callback_runs_at_once_when_the_client_is_behind(clock, notifier):
    since = clock.token
    clock.advance()
    callback = Recorder()
    result = await notifier.wait_for_events("@alice", since, 10, callback)
    assert callback.calls == [(since, clock.token)]
    assert result.next_token == clock.token


async def test_an_empty_result_waits_again_from_the_token_it_covered(clock, notifier):
    since = clock.token
    callback = Recorder([[], [], ["third"]])
    task = asyncio.create_task(notifier.wait_for_events("@alice", since, 10, callback))
    tokens = [since]
    for _ in range(3):
        await until(lambda: notifier.listening("@alice") == 1, 5.0)
        tokens.append(clock.advance())
        notifier.on_new_event("facts_key", users=["@alice"])
    result = await task
    assert result.result == ["third"]
    assert result.next_token == tokens[3]
    assert callback.calls == [(tokens[0], tokens[1]), (tokens[1], tokens[2]), (tokens[2], tokens[3])]


async def test_a_timeout_after_empty_results_returns_the_last_covered_token(clock, notifier):
    callback = Recorder([[]])
    task = asyncio.create_task(notifier.wait_for_events("@alice", clock.token, 0.3, callback))
    await until(lambda: notifier.open_waits == 1, 5.0)
    covered = clock.advance()
    notifier.on_new_event("facts_key", users=["@alice"])
    result = await task
    assert result.result == [] and result.timed_out
    assert result.next_token == covered


async def test_the_current_token_is_computed_once_per_event_however_many_users_wake(clock, notifier):
    tasks = [asyncio.create_task(notifier.wait_for_events(f"@u{i}", clock.token, 10, Recorder())) for i in range(50)]
    await until(lambda: notifier.open_waits == 50, 5.0)
    clock.advance()
    reads = clock.reads
    assert notifier.on_new_event("facts_key", users=[f"@u{i}" for i in range(50)]) == 50
    assert clock.reads == reads + 1
    await asyncio.gather(*tasks)


async def test_one_event_wakes_only_its_users_wait_among_a_thousand(clock, notifier):
    callbacks = {f"@u{i}": Recorder() for i in range(1000)}
    tasks = {u: asyncio.create_task(notifier.wait_for_events(u, clock.token, 30, cb)) for u, cb in callbacks.items()}
    try:
        await until(lambda: notifier.open_waits == 1000, 5.0)
        before = WAKEUPS._value.get()
        clock.advance()

        assert notifier.on_new_event("facts_key", users=["@u7"]) == 1

        await tasks["@u7"]
        await asyncio.sleep(0.01)
        assert WAKEUPS._value.get() == before + 1
        assert [u for u, t in tasks.items() if t.done()] == ["@u7"]
        assert [u for u, cb in callbacks.items() if cb.calls] == ["@u7"]
        assert notifier.open_waits == 999
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert notifier.open_waits == 0


async def test_wait_for_stream_token_returns_true_once_caught_up(clock, notifier):
    target = StreamToken.of(LAYOUT, {"facts_key": 2})
    assert not await notifier.wait_for_stream_token(target, timeout=0.05, poll=0.01)

    async def catch_up() -> None:
        await asyncio.sleep(0.02)
        clock.advance()
        clock.advance()
        notifier.on_new_event("facts_key")

    helper = asyncio.create_task(catch_up())
    assert await notifier.wait_for_stream_token(target, timeout=5, poll=10)  # woken by the event, not the poll
    await helper


@pytest.mark.serial  # asserts a time bound: run alone
async def test_wait_for_stream_token_gives_up_after_the_timeout_instead_of_hanging(clock, notifier):
    loop = asyncio.get_running_loop()
    started = loop.time()
    far = StreamToken.of(LAYOUT, {"facts_key": 10**9})
    assert await notifier.wait_for_stream_token(far, timeout=0.2, poll=0.05) is False
    assert 0.19 <= loop.time() - started < 2


async def test_idle_user_streams_expire_and_waiting_ones_do_not(clock):
    now = [0.0]
    notifier = Notifier(clock, idle_expiry=600, clock=lambda: now[0])
    await notifier.wait_for_events("@idle", clock.token, 0, Recorder())
    task = asyncio.create_task(notifier.wait_for_events("@busy", clock.token, 30, Recorder()))
    await until(lambda: notifier.open_waits == 1, 5.0)
    assert notifier.user_stream_count == 2

    now[0] = 599
    assert notifier.expire_idle() == 0
    now[0] = 601
    assert notifier.expire_idle() == 1
    assert notifier.user_stream_count == 1

    clock.advance()
    assert notifier.on_new_event("facts_key", users=["@busy", "@idle"]) == 1
    await task
    now[0] = 1300
    assert notifier.expire_idle() == 1
    assert notifier.user_stream_count == 0


async def test_a_cancelled_wait_leaves_nothing_behind(clock, notifier):
    task = asyncio.create_task(notifier.wait_for_events("@alice", clock.token, 30, Recorder()))
    await until(lambda: notifier.open_waits == 1, 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert notifier.open_waits == 0
    assert notifier.listening("@alice") == 0


async def test_a_room_new_to_the_index_covers_an_event_it_missed(clock, notifier):
    """An event of a room notified before the room was indexed for the user reached nobody: indexing the
    room (``watch_rooms``) moves the user's stream so that the next wait reads that range."""
    first = asyncio.create_task(notifier.wait_for_events("@alice", clock.token, 0.05, Recorder([[]])))
    await first  # alice has a user stream now, and no rooms
    since = clock.token
    missed = clock.advance()
    assert notifier.on_new_event("facts_key", rooms=["!new"]) == 0
    notifier.watch_rooms("@alice", ["!new"])
    callback = Recorder()
    result = await notifier.wait_for_events("@alice", since, 5, callback)
    assert callback.calls == [(since, missed)]
    assert result.result == ["something"]


async def test_watching_the_same_rooms_again_moves_nothing(clock, notifier):
    notifier.watch_rooms("@alice", ["!a"])
    await notifier.wait_for_events("@alice", clock.token, 0.01, Recorder([[]]))
    clock.advance()
    notifier.watch_rooms("@alice", ["!a"])
    callback = Recorder()
    result = await notifier.wait_for_events("@alice", StreamToken.start(LAYOUT), 0.05, callback)
    assert callback.calls == [], "no room was added: the wait must not read a range nobody notified"
    assert result.timed_out
