"""The demo story's waits on bob's /sync: a fact that arrives before its write's answer is not waited for
again (a CI run of the demo failed so: the to-device message came 17 ms into the long poll, before the
send's answer, and the story then waited 20 s for a second one)."""

from __future__ import annotations

import threading
import time

import pytest

from factstream.demo import story
from factstream.demo.cluster import DemoError
from factstream.demo.story import Record, SyncWatcher


class _Board:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def woke(self, line: str) -> None:
        self.lines.append(line)


def _answer(*to_device: int) -> dict[str, object]:
    items = [{"stream_id": n, "sender": "@alice:demo.local", "type": "m.demo.nudge"} for n in to_device]
    return {"next_batch": f"s{len(items)}", "streams": {"to_device": items}}


def _watcher() -> SyncWatcher:
    return SyncWatcher(client=None, record=Record(), board=_Board())  # type: ignore[arg-type]


def test_a_message_that_arrived_before_the_sends_answer_ends_the_wait_at_once():
    watcher = _watcher()
    before = watcher.to_device_count()  # counted before the send
    watcher.take(_answer(1), 17.0)  # bob's long poll brings it before the send answers
    started = time.monotonic()
    watcher.wait_for_to_device(before)
    assert time.monotonic() - started < 1.0
    assert watcher.to_device_count() == 1


def test_a_message_that_arrives_later_ends_the_wait_when_it_comes():
    watcher = _watcher()
    before = watcher.to_device_count()
    threading.Timer(0.2, watcher.take, args=(_answer(1), 200.0)).start()
    started = time.monotonic()
    watcher.wait_for_to_device(before)
    assert 0.1 < time.monotonic() - started < 10


def test_a_message_that_never_comes_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(story, "WAIT", 0.2)
    watcher = _watcher()
    watcher.take(_answer(1), 5.0)  # an earlier message does not count
    with pytest.raises(DemoError, match="did not bring the to_device message"):
        watcher.wait_for_to_device(watcher.to_device_count())
