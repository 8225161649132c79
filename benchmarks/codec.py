"""Replication lines per second through the command codec, against a baseline measured in the same run.

Run: ``uv run python benchmarks/codec.py [--seconds S]``.

The workload is a few thousand lines shaped like a busy deployment's traffic: mostly ``RDATA`` rows
of several streams (events ``["ev",{...}]``, cache invalidations, account data, receipts, presence,
typing, device lists), some of them ``batch`` rows, with ``POSITION`` and a few ``PING`` lines.

* Baseline: what any parser must at least do: ``name, rest = line.split(" ", 1)`` and, for
  ``RDATA``, ``json.loads`` of the row (the fourth field of ``rest``); other commands are not
  parsed further. No types, no validation.
* Measured: ``parse_command(line)``: the full parse into typed, validated commands.
* Serialisation, for information: ``to_line()`` of commands built locally (rows encoded), of
  received commands (which re-send the received row text), and a json-module baseline that formats
  the same lines the way Synapse does.

Both sides of a comparison run in alternating rounds over the whole workload, so drift in CPU speed
(frequency scaling, noisy neighbours) hits them alike.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from factstream.replication.wire import Command, PingCommand, PositionCommand, RdataCommand, parse_command

#: Lines in the workload.
LINES = 4000


def _ident(rnd: random.Random, size: int) -> str:
    return "".join(rnd.choices(string.ascii_letters + string.digits, k=size))


def _user(rnd: random.Random) -> str:
    return f"@{rnd.choice(['alice', 'bob', 'carol', 'dave', 'eve'])}{rnd.randrange(1000)}:example.org"


def _room(rnd: random.Random) -> str:
    return f"!{_ident(rnd, 18)}:example.org"


def _event_id(rnd: random.Random) -> str:
    return "$" + _ident(rnd, 43)


def _row(rnd: random.Random, stream: str) -> Any:
    """A row of ``stream`` as its writer would send it (the stream's row-type fields, in order)."""
    if stream == "events":
        kind = rnd.random()
        if kind < 0.8:
            return [
                "ev",
                {
                    "event_id": _event_id(rnd),
                    "room_id": _room(rnd),
                    "type": rnd.choice(["m.room.message", "m.reaction", "m.room.member", "m.room.encrypted"]),
                    "state_key": rnd.choice([None, _user(rnd)]),
                    "redacts": None,
                    "relates_to": rnd.choice([None, _event_id(rnd)]),
                    "membership": rnd.choice([None, "join", "leave"]),
                    "rejected": False,
                    "outlier": False,
                },
            ]
        return ["state", {"room_id": _room(rnd), "type": "m.room.member", "state_key": _user(rnd), "event_id": None}]
    if stream == "caches":
        cache = rnd.choice(["get_user_by_id", "get_users_in_room", "get_room_summary", "cs_cache_fake"])
        return [cache, [rnd.choice([_user(rnd), _room(rnd)])], 1700000000000 + rnd.randrange(10**6)]
    if stream == "account_data":
        return [_user(rnd), rnd.choice([None, _room(rnd)]), rnd.choice(["m.push_rules", "m.direct", "m.tag"])]
    if stream == "receipts":
        return [_room(rnd), "m.read", _user(rnd), _event_id(rnd), None, {"ts": 1700000000000 + rnd.randrange(10**6)}]
    if stream == "presence":
        ts = 1700000000000 + rnd.randrange(10**6)
        return [_user(rnd), rnd.choice(["online", "unavailable", "offline"]), ts, ts, ts, None, rnd.random() < 0.5]
    if stream == "typing":
        return [_room(rnd), [_user(rnd) for _ in range(rnd.randrange(4))]]
    if stream == "device_lists":
        return [_user(rnd), rnd.random() < 0.1, rnd.random() < 0.5]
    raise AssertionError(stream)


#: Stream mix: events and caches dominate real traffic.
_STREAMS = ["events"] * 40 + ["caches"] * 25 + ["account_data"] * 8 + ["receipts"] * 10 + ["presence"] * 8
_STREAMS += ["typing"] * 5 + ["device_lists"] * 4


def workload(count: int = LINES, seed: int = 1) -> list[str]:
    """``count`` lines, about 90 % RDATA (a tenth of them ``batch``), 8 % POSITION, 2 % PING."""
    rnd = random.Random(seed)
    token = 5_000_000
    lines = []
    for _ in range(count):
        kind = rnd.random()
        instance = rnd.choice(["master", "event_persister1", "event_persister2"])
        if kind < 0.90:
            stream = rnd.choice(_STREAMS)
            token += 1
            batched = rnd.random() < 0.1
            command: Command = RdataCommand(stream, instance, None if batched else token, _row(rnd, stream))
        elif kind < 0.98:
            command = PositionCommand(rnd.choice(_STREAMS), instance, token - rnd.randrange(5), token)
        else:
            command = PingCommand(str(1700000000000 + rnd.randrange(10**6)))
        lines.append(command.to_line())
    return lines


def baseline_parse(lines: Sequence[str]) -> None:
    loads = json.loads
    for line in lines:
        name, rest = line.split(" ", 1)
        if name == "RDATA":
            loads(rest.split(" ", 3)[3])


def factstream_parse(lines: Sequence[str]) -> None:
    parse = parse_command
    for line in lines:
        parse(line)


def baseline_serialise(lines: Sequence[str]) -> Callable[[], None]:
    """Synapse's way: ``" ".join`` of the fields and ``json.JSONEncoder.encode`` of the row."""
    encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
    prepared = []
    for line in lines:
        command = parse_command(line)
        if isinstance(command, RdataCommand):
            token = command.token
            prepared.append((command.NAME, command.stream_name, command.instance_name, token, command.row))
        else:
            prepared.append((command.NAME, command.to_body(), "", None, None))

    def run() -> None:
        for name, a, b, token, row in prepared:
            if name == "RDATA":
                name + " " + " ".join((a, b, str(token) if token is not None else "batch", encode(row)))
            else:
                name + " " + a

    return run


def serialise(commands: Sequence[Command]) -> Callable[[], None]:
    def run() -> None:
        for command in commands:
            command.to_line()

    return run


def _alternate(sides: dict[str, Callable[[], None]], per_round: int, seconds: float) -> dict[str, float]:
    """Items per second of each side, running them in turn (one round = one pass each) for ``seconds``."""
    spent = dict.fromkeys(sides, 0.0)
    rounds = 0
    stop = time.perf_counter() + seconds
    while rounds < 3 or time.perf_counter() < stop:
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            spent[name] += time.perf_counter() - start
        rounds += 1
    return {name: rounds * per_round / total for name, total in spent.items()}


def run(seconds: float) -> list[str]:
    """Measure for about ``seconds`` in total and return the report lines."""
    lines = workload()
    rdata = sum(line.startswith("RDATA ") for line in lines)
    report = [
        f"workload: {len(lines)} lines ({rdata} RDATA), {sum(map(len, lines)) / len(lines):.0f} characters on average"
    ]

    rates = _alternate(
        {"baseline": lambda: baseline_parse(lines), "parse_command": lambda: factstream_parse(lines)},
        len(lines),
        seconds * 0.6,
    )
    ratio = rates["parse_command"] / rates["baseline"]
    report.append(f"parse baseline (split + json.loads of the row): {rates['baseline']:>12,.0f} lines/s")
    report.append(f"parse_command (typed commands):                 {rates['parse_command']:>12,.0f} lines/s")
    report.append(f"parse ratio parse_command / baseline:           {ratio:12.2f}x (target >= 1.30x)")

    received = [parse_command(line) for line in lines]
    # ``msgspec.structs.replace`` builds a copy without the received row text: its row is encoded.
    fresh = [msgspec.structs.replace(command) for command in received]
    assert [command.to_line() for command in fresh] == lines, "the codec does not reproduce its own lines"
    rates = _alternate(
        {
            "baseline": baseline_serialise(lines),
            "fresh": serialise(fresh),
            "relay": serialise(received),
        },
        len(lines),
        seconds * 0.4,
    )
    report.append(f"serialise baseline (json module, Synapse-style):  {rates['baseline']:>12,.0f} lines/s")
    report.append(f"to_line, commands built locally (rows encoded): {rates['fresh']:>12,.0f} lines/s")
    report.append(f"to_line, received commands (row text re-sent):  {rates['relay']:>12,.0f} lines/s")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="total measuring time (default 3)")
    args = parser.parse_args()
    print(f"replication codec ({args.seconds:g} s):", flush=True)
    for line in run(args.seconds):
        print("  " + line, flush=True)


if __name__ == "__main__":
    main()
