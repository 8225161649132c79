"""The replication command codec: Synapse's wire lines, byte for byte, and every way a line can be wrong.

Golden lines come from Synapse's ``docs/tcp_replication.md`` (our ``seeds/tcp-replication.md``) and,
for the commands that document shows no example of, are written from the wire forms in
docs/replication.md, "Every command's wire form". Property tests generate every command type and check the round trip
``parse_command(cmd.to_line()) == cmd`` with a type-strict comparison (Python's ``==`` would let
``True`` pass for ``1`` and ``1.0`` for ``1``).

Fields that may contain spaces on the wire: the final free-text field of ``SERVER``, ``ERROR``,
``PING``, ``NAME``, ``CLEAR_USER_SYNC``, ``REMOTE_SERVER_UP``, ``NEW_ACTIVE_TASK`` and ``CANCEL_TASK``;
the RDATA row and the JSON fields of ``USER_IP`` and ``LOCK_RELEASED`` (JSON strings may even hold
newlines, which are escaped). Every other field is a space-free word.
"""

from __future__ import annotations

import json
import math
import types
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream.replication import wire as codec
from factstream.replication.wire import (
    BUILTIN_COMMANDS,
    CLIENT_SENDS,
    SERVER_SENDS,
    BlankLineError,
    CancelTaskCommand,
    ClearUserSyncCommand,
    Command,
    CommandEncodeError,
    CommandParseError,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
    decode_json,
    encode_json,
    encode_line,
    parse_command,
)


def synapse_json(value: Any) -> str:
    """Synapse's ``json_encoder.encode``, spelled out with the json module."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def typed(value: Any) -> Any:
    """A comparison key that tells apart what ``==`` does not: bool/int/float, -0.0/0.0, list/tuple/dict."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, bool | int | str) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(typed(key), typed(item)) for key, item in value.items()])
    if isinstance(value, Command):
        return (type(value).__name__, [typed(item) for item in msgspec.structs.astuple(value)])
    raise AssertionError(f"unexpected {type(value)}")


def assert_same(actual: Command, expected: Command) -> None:
    assert actual == expected
    assert typed(actual) == typed(expected)


def rebuilt(command: Command) -> Command:
    """The same command built from its fields: no received row text, so to_line encodes afresh."""
    return type(command)(*msgspec.structs.astuple(command))


# --------------------------------------------------------------------------------------------------
# Golden lines

GOLDEN: list[tuple[str, Command]] = [
    # seeds/tcp-replication.md, "Overview" and "Example"
    ("SERVER example.com", ServerCommand("example.com")),
    ("REPLICATE ", ReplicateCommand()),
    ("POSITION events master 53 53", PositionCommand("events", "master", 53, 53)),
    ("SERVER localhost:8823", ServerCommand("localhost:8823")),
    ("PING 1490197665618", PingCommand("1490197665618")),
    ("NAME synapse.app.appservice", NameCommand("synapse.app.appservice")),
    ("POSITION events master 1 1", PositionCommand("events", "master", 1, 1)),
    ("POSITION backfill master 1 1", PositionCommand("backfill", "master", 1, 1)),
    ("POSITION caches master 1 1", PositionCommand("caches", "master", 1, 1)),
    (
        'RDATA caches master 2 ["get_user_by_id",["@01register-user:localhost:8823"],1490197670513]',
        RdataCommand("caches", "master", 2, ["get_user_by_id", ["@01register-user:localhost:8823"], 1490197670513]),
    ),
    # The document wraps this line for display; on the wire it is one line.
    (
        'RDATA events master 14 ["$149019767112vOHxz:localhost:8823",'
        '"!AFDCvgApUmpdfVjIXm:localhost:8823","m.room.guest_access","",null]',
        RdataCommand(
            "events",
            "master",
            14,
            [
                "$149019767112vOHxz:localhost:8823",
                "!AFDCvgApUmpdfVjIXm:localhost:8823",
                "m.room.guest_access",
                "",
                None,
            ],
        ),
    ),
    ("ERROR server stopping", ErrorCommand("server stopping")),
    # "An example of a batched set of RDATA"
    (
        'RDATA caches master batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]',
        RdataCommand("caches", "master", None, ["get_user_by_id", ["@test:localhost:8823"], 1490197670513]),
    ),
    (
        'RDATA caches master batch ["get_user_by_id",["@test2:localhost:8823"],1490197670513]',
        RdataCommand("caches", "master", None, ["get_user_by_id", ["@test2:localhost:8823"], 1490197670513]),
    ),
    (
        'RDATA caches master batch ["get_user_by_id",["@test3:localhost:8823"],1490197670513]',
        RdataCommand("caches", "master", None, ["get_user_by_id", ["@test3:localhost:8823"], 1490197670513]),
    ),
    (
        'RDATA caches master 54 ["get_user_by_id",["@test4:localhost:8823"],1490197670513]',
        RdataCommand("caches", "master", 54, ["get_user_by_id", ["@test4:localhost:8823"], 1490197670513]),
    ),
    # "Cache Invalidation Stream": hand-written with spaces after the commas; re-sent verbatim.
    (
        'RDATA caches master 550953771 ["get_user_by_id", ["@bob:example.com"], 1550574873251]',
        RdataCommand("caches", "master", 550953771, ["get_user_by_id", ["@bob:example.com"], 1550574873251]),
    ),
    (
        'RDATA caches master 550953772 ["get_user_by_id", null, 1550574873252]',
        RdataCommand("caches", "master", 550953772, ["get_user_by_id", None, 1550574873252]),
    ),
    # docs/replication.md, "Every command's wire form": the ERROR lines the protocol sends.
    ("ERROR Wrong remote", ErrorCommand("Wrong remote")),
    ("ERROR ping timeout", ErrorCommand("ping timeout")),
    ("ERROR Failed to keep up", ErrorCommand("Failed to keep up")),
    ("ERROR Line length exceeded", ErrorCommand("Line length exceeded")),
    # Wire forms of docs/replication.md ("Every command's wire form") for the commands the seed shows no example of.
    (
        "USER_SYNC worker1 @alice:example.com None start 1490197665618",
        UserSyncCommand("worker1", "@alice:example.com", None, True, 1490197665618),
    ),
    (
        "USER_SYNC worker1 @alice:example.com ABCDEFGH end 1490197675618",
        UserSyncCommand("worker1", "@alice:example.com", "ABCDEFGH", False, 1490197675618),
    ),
    ("CLEAR_USER_SYNC worker1", ClearUserSyncCommand("worker1")),
    ("FEDERATION_ACK federation_sender1 4071", FederationAckCommand("federation_sender1", 4071)),
    (
        'USER_IP @alice:example.com ["syt_YWxpY2U_secret","10.0.0.1","Mozilla/5.0 (X11; Linux x86_64)",'
        '"ABCDEFGH",1490197665618]',
        UserIpCommand(
            "@alice:example.com",
            "syt_YWxpY2U_secret",
            "10.0.0.1",
            "Mozilla/5.0 (X11; Linux x86_64)",
            "ABCDEFGH",
            1490197665618,
        ),
    ),
    (
        'USER_IP @bot:example.com ["syt_Ym90_secret","::1","",null,1490197665618]',
        UserIpCommand("@bot:example.com", "syt_Ym90_secret", "::1", "", None, 1490197665618),
    ),
    ("REMOTE_SERVER_UP matrix.org", RemoteServerUpCommand("matrix.org")),
    (
        'LOCK_RELEASED ["master","_background_update","sliding_sync_rooms"]',
        LockReleasedCommand("master", "_background_update", "sliding_sync_rooms"),
    ),
    ("NEW_ACTIVE_TASK aBcDeFgHiJkLmNoP", NewActiveTaskCommand("aBcDeFgHiJkLmNoP")),
    ("CANCEL_TASK aBcDeFgHiJkLmNoP", CancelTaskCommand("aBcDeFgHiJkLmNoP")),
]


def test_a_position_may_carry_the_writers_clock_stamp_as_a_trailing_field() -> None:
    # Beyond the reference (docs/replication.md, "Lag"): the line without it is the reference's.
    stamped = PositionCommand("events", "master", 1, 2, 1795000000123)
    assert parse_command("POSITION events master 1 2 1795000000123") == stamped
    assert stamped.to_line() == "POSITION events master 1 2 1795000000123"
    assert stamped.unstamped().to_line() == "POSITION events master 1 2"
    assert parse_command("POSITION events master 1 2").stamp is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("line", "expected"), GOLDEN, ids=[line[:60] for line, _ in GOLDEN])
def test_golden_line_parses_to_its_fields_and_serialises_byte_identically(line: str, expected: Command) -> None:
    command = parse_command(line)

    assert_same(command, expected)
    assert command.to_line() == line
    assert encode_line(command) == line.encode() + b"\n"
    assert parse_command(line.encode() + b"\n") == expected


def test_golden_lines_cover_every_builtin_command() -> None:
    assert {type(command) for _, command in GOLDEN} == set(BUILTIN_COMMANDS)


@pytest.mark.parametrize(("line", "expected"), GOLDEN, ids=[line[:60] for line, _ in GOLDEN])
def test_golden_command_built_locally_serialises_like_synapse(line: str, expected: Command) -> None:
    """The same values, built rather than received, give Synapse's compact encoding."""
    compact = line
    if isinstance(expected, RdataCommand):
        compact = " ".join([*line.split(" ", 4)[:4], synapse_json(expected.row)])
    assert expected.to_line() == compact


def test_replicate_without_trailing_space_parses_and_is_sent_with_it() -> None:
    command = parse_command("REPLICATE")  # as typed by hand (the seed document shows it like this)

    assert command == ReplicateCommand()
    assert command.to_line() == "REPLICATE "


def test_replicate_ignores_a_body_like_synapse() -> None:
    assert parse_command("REPLICATE events 1") == ReplicateCommand()


def test_elided_row_in_the_overview_example_is_not_json() -> None:
    with pytest.raises(CommandParseError, match=r"^RDATA: row is not valid JSON: "):
        parse_command('RDATA events master 54 ["$foo1:bar.com", ...]')


def test_free_text_bodies_keep_all_their_spaces() -> None:
    assert parse_command("ERROR  two  spaces ") == ErrorCommand(" two  spaces ")
    assert parse_command("ERROR ") == ErrorCommand("")
    assert parse_command("PING") == PingCommand("")
    assert ErrorCommand(" two  spaces ").to_line() == "ERROR  two  spaces "


# --------------------------------------------------------------------------------------------------
# Line terminators and blank lines


@pytest.mark.parametrize("line", ["PING 1\n", "PING 1\r\n", b"PING 1\n", b"PING 1\r\n", b"PING 1", "PING 1"])
def test_one_trailing_line_terminator_is_removed(line: str | bytes) -> None:
    assert parse_command(line) == PingCommand("1")


def test_a_carriage_return_without_newline_is_part_of_the_body() -> None:
    assert parse_command("PING 1\r") == PingCommand("1\r")


@pytest.mark.parametrize("line", ["", "\n", "\r\n", "   ", " \t ", b"", b"  \r\n", "\u3000"])
def test_blank_lines_raise_blank_line_error_so_transports_can_ignore_them(line: str | bytes) -> None:
    with pytest.raises(BlankLineError):
        parse_command(line)
    assert issubclass(BlankLineError, CommandParseError)


# --------------------------------------------------------------------------------------------------
# Bad input

BAD_LINES: list[tuple[str | bytes, str]] = [
    ("FOO bar", "unknown command 'FOO'"),
    ("rdata events master 1 []", "unknown command 'rdata'"),
    (" PING 1", "unknown command ''"),
    ("X" * 200, "unknown command " + repr("X" * 80) + "... (200 characters)"),
    ("RDATA events master x []", "RDATA: token 'x' is not an integer or 'batch'"),
    ("RDATA events master +1 []", "RDATA: token '+1' is not an integer or 'batch'"),
    ("RDATA events master 1_0 []", "RDATA: token '1_0' is not an integer or 'batch'"),
    ("RDATA events master \u0661 []", "RDATA: token '\u0661' is not an integer or 'batch'"),
    ("RDATA events master  []", "RDATA: token '' is not an integer or 'batch'"),
    ("RDATA events master Batch []", "RDATA: token 'Batch' is not an integer or 'batch'"),
    ("RDATA events master 1", "RDATA: expected 4 fields, got 3"),
    ("RDATA", "RDATA: expected 4 fields, got 1"),
    ("RDATA events master 1 ", "RDATA: row is not valid JSON: Input data was truncated"),
    ("RDATA events master 1 [1,", "RDATA: row is not valid JSON: Input data was truncated"),
    ("RDATA events master 1 [1] x", "RDATA: row is not valid JSON: JSON is malformed: trailing characters (byte 5)"),
    ("RDATA events master 1 [NaN]", "RDATA: row is not valid JSON: JSON is malformed: invalid character (byte 1)"),
    ("RDATA events master 1 [Infinity]", "RDATA: row is not valid JSON: JSON is malformed: invalid character (byte 1)"),
    ("POSITION events master", "POSITION: expected 4 fields, got 2"),
    ("POSITION events master 1 x", "POSITION: new_token 'x' is not an integer"),
    ("POSITION events master y 1", "POSITION: prev_token 'y' is not an integer"),
    ("POSITION events master 1 2 x", "POSITION: stamp 'x' is not an integer"),
    ("POSITION events master 1 2 3 4", "POSITION: stamp '3 4' is not an integer"),
    ("POSITION events master batch 1", "POSITION: prev_token 'batch' is not an integer"),
    ("POSITION events master 1 +2", "POSITION: new_token '+2' is not an integer"),
    ("POSITION events master \u0661 2", "POSITION: prev_token '\u0661' is not an integer"),
    ("POSITION events master -- 2", "POSITION: prev_token '--' is not an integer"),
    ("FEDERATION_ACK fs1 1_000", "FEDERATION_ACK: token '1_000' is not an integer"),
    ("USER_SYNC w1 @a:hs None start \t5", "USER_SYNC: last_sync_ms '\\t5' is not an integer"),
    ("USER_SYNC w1 @a:hs None maybe 5", "USER_SYNC: state 'maybe' is not 'start' or 'end'"),
    ("USER_SYNC w1 @a:hs None start", "USER_SYNC: expected 5 fields, got 4"),
    ("USER_SYNC w1 @a:hs None start soon", "USER_SYNC: last_sync_ms 'soon' is not an integer"),
    ("FEDERATION_ACK fs1 1 2", "FEDERATION_ACK: expected 2 fields, got 3"),
    ("FEDERATION_ACK fs1", "FEDERATION_ACK: expected 2 fields, got 1"),
    ("FEDERATION_ACK fs1 x", "FEDERATION_ACK: token 'x' is not an integer"),
    ("USER_IP @a:hs", "USER_IP: expected 2 fields, got 1"),
    ("USER_IP @a:hs [", "USER_IP: body is not valid JSON: Input data was truncated"),
    (
        'USER_IP @a:hs ["t","ip","ua",null]',
        "USER_IP: expected a JSON array [access_token, ip, user_agent, device_id, last_seen]: "
        "Expected `array` of length 5, got 4",
    ),
    (
        'USER_IP @a:hs ["t","ip","ua",null,"5"]',
        "USER_IP: expected a JSON array [access_token, ip, user_agent, device_id, last_seen]: "
        "Expected `int`, got `str` - at `$[4]`",
    ),
    (
        'USER_IP @a:hs ["t","ip","ua",null,true]',
        "USER_IP: expected a JSON array [access_token, ip, user_agent, device_id, last_seen]: "
        "Expected `int`, got `bool` - at `$[4]`",
    ),
    (
        'LOCK_RELEASED ["master","lock"]',
        "LOCK_RELEASED: expected a JSON array [instance_name, lock_name, lock_key]: "
        "Expected `array` of length 3, got 2",
    ),
    (
        'LOCK_RELEASED {"instance_name":"master"}',
        "LOCK_RELEASED: expected a JSON array [instance_name, lock_name, lock_key]: Expected `array`, got `object`",
    ),
    (
        "LOCK_RELEASED master lock key",
        "LOCK_RELEASED: body is not valid JSON: JSON is malformed: invalid character (byte 0)",
    ),
    (
        b"PING \xff",
        "PING: line is not valid UTF-8: 'utf-8' codec can't decode byte 0xff in position 5: invalid start byte",
    ),
    ("PING a\nb", "PING: a line cannot contain a newline"),
    ("PING a\nb\n", "PING: a line cannot contain a newline"),
    ("PING 1\n\n", "PING: a line cannot contain a newline"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[repr(line)[:50] for line, _ in BAD_LINES])
def test_bad_line_raises_parse_error_naming_command_and_reason(line: str | bytes, message: str) -> None:
    with pytest.raises(CommandParseError) as caught:
        parse_command(line)

    assert str(caught.value) == message
    assert not isinstance(caught.value, BlankLineError)


def test_parse_error_is_a_factstream_error_and_a_value_error() -> None:
    from factstream.errors import FactstreamError

    assert issubclass(CommandParseError, FactstreamError)
    assert issubclass(CommandParseError, ValueError)


@pytest.mark.parametrize("line", ["RDATA s i {} []", "POSITION s i 1 {}", "FEDERATION_ACK fs1 {}"])
def test_integers_longer_than_python_converts_are_a_parse_error(line: str) -> None:
    digits = "9" * 5000  # beyond sys.get_int_max_str_digits()
    with pytest.raises(CommandParseError, match=r"token '9{80}'\.\.\. \(5000 characters\) is not an integer"):
        parse_command(line.format(digits))


def test_integers_with_leading_zeros_or_minus_are_accepted_like_synapse() -> None:
    assert parse_command("POSITION events master 007 -3") == PositionCommand("events", "master", 7, -3)
    assert parse_command("RDATA events master -12 []") == RdataCommand("events", "master", -12, [])


def test_rows_synapse_accepts_beyond_msgspec_are_accepted() -> None:
    """Escaped lone surrogates and numbers beyond the float range: Synapse's json decoder takes them."""
    command = parse_command('RDATA events master 1 ["\\ud800",1e400]')

    assert isinstance(command, RdataCommand)
    assert command.row[0] == "\ud800"
    assert command.row[1] == math.inf


# --------------------------------------------------------------------------------------------------
# Serialising: what cannot be sent


ENCODE_ERRORS: list[tuple[Command, str]] = [
    (PingCommand("a\nb"), "PING: a command cannot contain a newline"),
    (ErrorCommand("oops\n"), "ERROR: a command cannot contain a newline"),
    (ErrorCommand("oops\r"), "ERROR: a command cannot end in a carriage return"),
    (RdataCommand("events\n", "master", 1, []), "RDATA: a command cannot contain a newline"),
    (RdataCommand("ev ents", "master", 1, []), "RDATA: stream_name 'ev ents' contains a space"),
    (RdataCommand("events", "mas ter", 1, []), "RDATA: instance_name 'mas ter' contains a space"),
    (RdataCommand("events", "master", True, []), "RDATA: token must be an int, got bool"),
    (RdataCommand("events", "master", 1.0, []), "RDATA: token must be an int, got float"),  # type: ignore[arg-type]
    (
        RdataCommand("events", "master", 1, [math.nan]),
        "RDATA: row is not JSON-serialisable: Out of range float values are not JSON compliant",
    ),
    (
        RdataCommand("events", "master", 1, {"x": -math.inf}),
        "RDATA: row is not JSON-serialisable: Out of range float values are not JSON compliant",
    ),
    (
        RdataCommand("events", "master", 1, [{1, 2}]),
        "RDATA: row is not JSON-serialisable: Object of type set is not JSON serializable",
    ),
    (
        RdataCommand("events", "master", 1, [b"bytes"]),
        "RDATA: row is not JSON-serialisable: Object of type bytes is not JSON serializable",
    ),
    (PositionCommand("events", "master", 1, "2"), "POSITION: new_token must be an int, got str"),  # type: ignore[arg-type]
    (PositionCommand("events", "master", None, 2), "POSITION: prev_token must be an int, got NoneType"),  # type: ignore[arg-type]
    (
        UserSyncCommand("w1", "@a:hs", "None", True, 1),
        "USER_SYNC: device_id 'None' cannot be sent (the wire word for no device)",
    ),
    (UserSyncCommand("w1", "@a:hs", "my device", True, 1), "USER_SYNC: device_id 'my device' contains a space"),
    (UserSyncCommand("w1", "@a:hs", None, 1, 1), "USER_SYNC: is_syncing must be a bool, got int"),  # type: ignore[arg-type]
    (FederationAckCommand("fs 1", 1), "FEDERATION_ACK: instance_name 'fs 1' contains a space"),
    (UserIpCommand("@a:hs", "t", "ip", "ua", None, 1.5), "USER_IP: last_seen must be an int, got float"),  # type: ignore[arg-type]
    (UserIpCommand("@a:hs", "t", 1, "ua", None, 1), "USER_IP: ip must be a str, got int"),  # type: ignore[arg-type]
    (UserIpCommand("@a b:hs", "t", "ip", "ua", None, 1), "USER_IP: user_id '@a b:hs' contains a space"),
    (LockReleasedCommand("master", "lock", 3), "LOCK_RELEASED: lock_key must be a str, got int"),  # type: ignore[arg-type]
    (ServerCommand(None), "SERVER: server_name must be a str, got NoneType"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("command", "message"), ENCODE_ERRORS, ids=[m for _, m in ENCODE_ERRORS])
def test_unsendable_command_raises_encode_error_at_the_sender(command: Command, message: str) -> None:
    with pytest.raises(CommandEncodeError) as caught:
        command.to_line()
    assert str(caught.value).startswith(message)  # the json module's own text may add detail
    with pytest.raises(CommandEncodeError):
        encode_line(command)


def test_newlines_inside_json_strings_are_escaped_not_refused() -> None:
    command = RdataCommand("events", "master", 1, ["line one\nline two\r\n"])

    assert command.to_line() == 'RDATA events master 1 ["line one\\nline two\\r\\n"]'
    assert parse_command(command.to_line()) == command


def test_encode_line_refuses_lone_surrogates_in_text_fields() -> None:
    with pytest.raises(CommandEncodeError, match=r"^PING: the line is not encodable as UTF-8"):
        encode_line(PingCommand("\ud800"))


# --------------------------------------------------------------------------------------------------
# JSON exactly like Synapse's encoder


def test_non_ascii_and_astral_characters_in_rows_are_escaped_like_python_json() -> None:
    row = ["caf\u00e9", "\U0001f600", {"\u00fc": "\u2028\u2029"}, "\x7f", "\x00\x1f"]
    command = RdataCommand("events", "master", 7, row)

    line = command.to_line()

    assert line == (
        'RDATA events master 7 ["caf\\u00e9","\\ud83d\\ude00",{"\\u00fc":"\\u2028\\u2029"},"\\u007f","\\u0000\\u001f"]'
    )
    assert line == "RDATA events master 7 " + synapse_json(row)
    assert line.isascii()
    assert_same(parse_command(line), command)


def test_received_raw_utf8_row_is_relayed_verbatim_and_escaped_when_rebuilt() -> None:
    command = parse_command('RDATA events master 7 ["caf\u00e9"]'.encode())

    assert command == RdataCommand("events", "master", 7, ["caf\u00e9"])
    assert command.to_line() == 'RDATA events master 7 ["caf\u00e9"]'
    assert rebuilt(command).to_line() == 'RDATA events master 7 ["caf\\u00e9"]'


def test_del_is_escaped_like_python_json_in_an_otherwise_ascii_row() -> None:
    """DEL is ASCII, so the ASCII check alone would let msgspec's raw DEL through."""
    assert encode_json(["a\x7fb"]) == '["a\\u007fb"]' == synapse_json(["a\x7fb"])


def test_lone_surrogates_are_escaped_like_python_json_and_read_back() -> None:
    command = RdataCommand("events", "master", 7, ["\ud800x", "\udfff"])

    line = command.to_line()

    assert line == 'RDATA events master 7 ["\\ud800x","\\udfff"]'
    assert_same(parse_command(line), command)


FLOATS = [
    0.0,
    -0.0,
    0.1,
    1.5,
    -2.25,
    1e-4,
    math.nextafter(1e-4, 0),
    1e-5,
    1e-7,
    5e-324,
    123456.789,
    9999999999999998.0,
    1e16,
    -1e16,
    1.5e16,
    1e17,
    1e21,
    1e22,
    1.7976931348623157e308,
    12345678901234567890.0,
]


@pytest.mark.parametrize("value", FLOATS, ids=repr)
def test_floats_are_written_like_python_repr(value: float) -> None:
    assert encode_json([value]) == synapse_json([value])
    assert encode_json({"x": value}) == synapse_json({"x": value})


def test_msgspec_and_python_disagree_on_exponent_floats_which_is_why_they_are_special_cased() -> None:
    # If msgspec ever changes this, the fast path could take these floats too; until then it must not.
    assert msgspec.json.encode(1e16) == b"1e16"
    assert synapse_json(1e16) == "1e+16"
    assert msgspec.json.encode(1e-5) == b"0.00001"
    assert synapse_json(1e-5) == "1e-05"


def test_dict_key_order_is_preserved() -> None:
    value = {"z": 1, "a": 2, "m": [3, {"b": 4, "a": 5}]}

    assert encode_json(value) == '{"z":1,"a":2,"m":[3,{"b":4,"a":5}]}'


def test_values_the_json_module_handles_specially_are_encoded_like_it() -> None:
    class Flag(int):
        pass

    values: list[Any] = [
        (1, "two", None),  # tuples are arrays
        {1: "int key", "s": "str key"},
        {True: "bool key", False: "bool key"},
        {None: "null key"},
        {2.5: "float key", 1e16: "exponent key"},
        2**100,
        -(2**64),
        types.MappingProxyType({"read": "only"}),  # what Synapse's encoder does for immutabledict
        [Flag(3), True, False],
        "\U0010ffff",
    ]
    for value in values:
        expected = json.dumps(value, separators=(",", ":"), allow_nan=False, default=dict)
        assert encode_json(value) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1, {"a": math.nan}]], ids=repr)
def test_nan_and_infinity_are_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        encode_json(value)


@pytest.mark.parametrize(
    "value",
    [{1, 2}, b"x", object(), [msgspec.Struct], {"a": frozenset()}],
    # the same ids in every process (pytest-xdist workers must collect the same tests): no address
    ids=["set", "bytes", "object", "list-of-a-type", "dict-of-frozenset"],
)
def test_types_the_json_module_refuses_are_refused_although_msgspec_would_encode_some(value: Any) -> None:
    with pytest.raises(TypeError, match="is not JSON serializable"):
        encode_json(value)


def test_plain_ascii_values_take_the_msgspec_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path exists: an ASCII row of plain values never reaches the json module."""

    class NoJson:
        def encode(self, value: Any) -> str:
            raise AssertionError(f"json module used for {value!r}")

    monkeypatch.setattr("factstream.replication.wire.json._json_encoder", NoJson())

    assert encode_json(["get_user", ["@a:hs"], 1700000000000, 0.5, None, True, {"k": -1}]) == (
        '["get_user",["@a:hs"],1700000000000,0.5,null,true,{"k":-1}]'
    )


def test_decode_json_refuses_python_extensions() -> None:
    for text in ["NaN", "[Infinity]", "-Infinity"]:
        with pytest.raises(ValueError):
            decode_json(text)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.text(st.characters(exclude_categories=()))  # lone surrogates too
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=500)
@given(json_values)
def test_encode_json_matches_synapse_encoder_and_decodes_back(value: Any) -> None:
    text = encode_json(value)

    assert text == synapse_json(value)
    assert typed(decode_json(text)) == typed(value)


# --------------------------------------------------------------------------------------------------
# Property tests: every command type round-trips

#: A field followed by another one: anything but a space or newline ("\r" is allowed: not at the end).
words = st.text(st.characters(exclude_characters=" \n"))
#: A final free-text field: no newline and no trailing "\r" (a reader would take it for "\r\n").
free_text = st.text(st.characters(exclude_characters="\n")).filter(lambda s: not s.endswith("\r"))
any_text = st.text(st.characters(exclude_categories=()))
ints = st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
rows = st.lists(json_values, max_size=8) | json_values

commands_by_type: dict[type[Command], st.SearchStrategy[Command]] = {
    ServerCommand: st.builds(ServerCommand, free_text),
    RdataCommand: st.builds(RdataCommand, words, words, st.none() | ints, rows),
    PositionCommand: st.builds(PositionCommand, words, words, ints, ints),
    ErrorCommand: st.builds(ErrorCommand, free_text),
    PingCommand: st.builds(PingCommand, free_text),
    NameCommand: st.builds(NameCommand, free_text),
    ReplicateCommand: st.builds(ReplicateCommand),
    UserSyncCommand: st.builds(
        UserSyncCommand, words, words, st.none() | words.filter(lambda s: s != "None"), st.booleans(), ints
    ),
    FederationAckCommand: st.builds(FederationAckCommand, words, ints),
    UserIpCommand: st.builds(UserIpCommand, words, any_text, any_text, any_text, st.none() | any_text, ints),
    RemoteServerUpCommand: st.builds(RemoteServerUpCommand, free_text),
    ClearUserSyncCommand: st.builds(ClearUserSyncCommand, free_text),
    LockReleasedCommand: st.builds(LockReleasedCommand, any_text, any_text, any_text),
    NewActiveTaskCommand: st.builds(NewActiveTaskCommand, free_text),
    CancelTaskCommand: st.builds(CancelTaskCommand, free_text),
}


def test_property_strategies_cover_every_builtin_command() -> None:
    assert set(commands_by_type) == set(BUILTIN_COMMANDS)


@pytest.mark.parametrize("command_type", BUILTIN_COMMANDS, ids=lambda t: t.NAME)
@settings(max_examples=150)
@given(data=st.data())
def test_every_command_round_trips_through_its_line(command_type: type[Command], data: st.DataObject) -> None:
    command = data.draw(commands_by_type[command_type])

    line = command.to_line()
    parsed = parse_command(line)

    assert_same(parsed, command)
    assert line.startswith(command_type.NAME + " ")
    assert "\n" not in line


@pytest.mark.parametrize("command_type", BUILTIN_COMMANDS, ids=lambda t: t.NAME)
@settings(max_examples=100)
@given(data=st.data())
def test_serialisation_is_stable(command_type: type[Command], data: st.DataObject) -> None:
    """serialise -> parse -> serialise gives the same line, also when the parsed command is rebuilt."""
    line = data.draw(commands_by_type[command_type]).to_line()

    parsed = parse_command(line)

    assert parsed.to_line() == line
    assert rebuilt(parsed).to_line() == line


@settings(max_examples=200)
@given(st.one_of(*commands_by_type.values()))
def test_encoded_lines_parse_back_from_bytes(command: Command) -> None:
    try:
        data = encode_line(command)
    except CommandEncodeError:  # lone surrogates in a text field
        return
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    assert_same(parse_command(data), command)


@settings(max_examples=200)
@given(st.one_of(*commands_by_type.values()))
def test_every_non_final_text_field_refuses_a_space(command: Command) -> None:
    """A space there would shift every later field on the receiving side."""
    word_fields = {
        RdataCommand: ("stream_name", "instance_name"),
        PositionCommand: ("stream_name", "instance_name"),
        UserSyncCommand: ("instance_id", "user_id"),
        FederationAckCommand: ("instance_name",),
        UserIpCommand: ("user_id",),
    }.get(type(command), ())
    for field in word_fields:
        bad = msgspec.structs.replace(command, **{field: getattr(command, field) + " x"})
        with pytest.raises(CommandEncodeError, match=f"{field} .* contains a space"):
            bad.to_line()


# --------------------------------------------------------------------------------------------------
# RDATA specifics


def test_rdata_equality_ignores_the_received_row_text() -> None:
    spaced = parse_command("RDATA caches master 5 [1, 2]")
    compact = parse_command("RDATA caches master 5 [1,2]")

    assert isinstance(spaced, RdataCommand)
    assert isinstance(compact, RdataCommand)
    assert spaced.row_json == "[1, 2]"
    assert compact.row_json == "[1,2]"
    assert spaced == compact == RdataCommand("caches", "master", 5, [1, 2])
    assert spaced != RdataCommand("caches", "master", 6, [1, 2])
    assert spaced != RdataCommand("caches", "master", 5, [1, 3])
    assert spaced != RdataCommand("caches", "other", 5, [1, 2])
    assert RdataCommand("caches", "master", 5, [1, 2]).row_json is None
    assert "row_json" not in repr(spaced) and "[1, 2]'" not in repr(spaced)


def test_replacing_a_field_of_a_received_rdata_drops_the_received_text() -> None:
    received = parse_command("RDATA caches master 5 [1, 2]")

    changed = msgspec.structs.replace(received, row=[3])

    assert isinstance(changed, RdataCommand)
    assert changed.row_json is None
    assert changed.to_line() == "RDATA caches master 5 [3]"


def test_rdata_rows_may_be_any_json_value_and_tuples_are_sent_as_arrays() -> None:
    assert RdataCommand("s", "i", 1, ("a", 1)).to_line() == 'RDATA s i 1 ["a",1]'
    assert parse_command('RDATA s i 1 {"a":[1]}') == RdataCommand("s", "i", 1, {"a": [1]})
    assert parse_command("RDATA s i 1 null") == RdataCommand("s", "i", 1, None)
    assert parse_command('RDATA s i 1 "x y"') == RdataCommand("s", "i", 1, "x y")


def test_rdata_batch_token_is_none_and_big_tokens_survive() -> None:
    assert parse_command("RDATA s i batch []") == RdataCommand("s", "i", None, [])
    big = 2**70
    assert parse_command(f"RDATA s i {big} []") == RdataCommand("s", "i", big, [])
    assert RdataCommand("s", "i", big, []).to_line() == f"RDATA s i {big} []"


def test_commands_are_frozen() -> None:
    command = PositionCommand("events", "master", 1, 2)
    with pytest.raises(AttributeError):
        command.new_token = 3  # type: ignore[misc]
    received = parse_command("RDATA s i 1 []")
    with pytest.raises(AttributeError):
        received.token = 2  # type: ignore[attr-defined]


def test_user_ip_repr_hides_the_access_token() -> None:
    command = UserIpCommand("@a:hs", "syt_secret", "10.0.0.1", "curl", None, 1)

    assert "syt_secret" not in repr(command)
    assert "10.0.0.1" in repr(command)


# --------------------------------------------------------------------------------------------------
# Directions, Redis channels


def test_direction_allow_lists_match_synapse() -> None:
    assert {"SERVER", "RDATA", "POSITION", "ERROR", "PING", "REMOTE_SERVER_UP", "LOCK_RELEASED"} == SERVER_SENDS
    assert {
        "NAME",
        "REPLICATE",
        "PING",
        "USER_SYNC",
        "CLEAR_USER_SYNC",
        "FEDERATION_ACK",
        "USER_IP",
        "ERROR",
        "REMOTE_SERVER_UP",
        "LOCK_RELEASED",
    } == CLIENT_SENDS
    redis_only = {cls.NAME for cls in BUILTIN_COMMANDS} - SERVER_SENDS - CLIENT_SENDS
    assert redis_only == {"NEW_ACTIVE_TASK", "CANCEL_TASK"}


@pytest.mark.parametrize("command_type", BUILTIN_COMMANDS, ids=lambda t: t.NAME)
def test_redis_channel_is_the_prefix_except_user_ip(command_type: type[Command]) -> None:
    expected = "example.com/USER_IP" if command_type is UserIpCommand else "example.com"
    assert command_type.redis_channel("example.com") == expected


def test_rows_nested_too_deeply_for_both_decoders_are_a_parse_error() -> None:
    depth = 100_000
    with pytest.raises(CommandParseError, match=r"^RDATA: row is not valid JSON: maximum recursion depth exceeded"):
        parse_command("RDATA s i 1 " + "[" * depth + "]" * depth)


def test_deeply_nested_rows_round_trip() -> None:
    deep: Any = []
    for _ in range(50):
        deep = [deep]
    command = RdataCommand("s", "i", 1, deep)
    assert parse_command(command.to_line()) == command


@given(
    st.text(st.characters(exclude_characters=" \n", exclude_categories=("Cs",)), min_size=1),
    st.text(st.characters(exclude_characters=" \n", exclude_categories=("Cs",)), min_size=1),
    st.lists(st.tuples(st.none() | st.integers(), st.lists(json_values, max_size=4)), max_size=6),
)
@settings(max_examples=300)
def test_rdata_lines_for_a_run_of_rows_match_one_command_at_a_time(stream: str, instance: str, pairs: list) -> None:
    """The streamer's bulk encoder writes exactly what encoding each RdataCommand would, or refuses alike."""
    expected: list[bytes] | type[Exception]
    try:
        expected = [codec.encode_line(RdataCommand(stream, instance, token, row)) for token, row in pairs]
    except codec.CommandEncodeError:
        expected = codec.CommandEncodeError
    if expected is codec.CommandEncodeError:
        with pytest.raises(codec.CommandEncodeError):
            codec.encode_rdata_lines(stream, instance, pairs)
    else:
        assert codec.encode_rdata_lines(stream, instance, pairs) == expected
        tokens, rows = [t for t, _ in pairs], [r for _, r in pairs]
        assert codec.encode_rdata_run(stream, instance, tokens, rows, end=b"") == [line[:-1] for line in expected]


plain_ascii_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(st.characters(min_codepoint=0, max_codepoint=127)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(
    st.lists(
        st.tuples(st.none() | st.integers(min_value=0), st.lists(plain_ascii_values, max_size=4)),
        min_size=1,
        max_size=8,
    )
)
@settings(max_examples=300)
def test_plain_ascii_rows_take_the_bulk_path_and_still_match_one_command_at_a_time(pairs: list) -> None:
    """Rows msgspec writes like the json module (ASCII, no floats) are encoded in bulk, byte-identically."""
    expected = [codec.encode_line(RdataCommand("events", "main", token, row)) for token, row in pairs]
    tokens, rows = [t for t, _ in pairs], [r for _, r in pairs]
    assert codec.encode_rdata_run("events", "main", tokens, rows) == expected
    # Without line ends (what the Redis transport publishes): the same lines.
    assert codec.encode_rdata_run("events", "main", tokens, rows, end=b"") == [line[:-1] for line in expected]
