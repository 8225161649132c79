"""factstream_events.rules.canonical: Matrix canonical JSON and strict parsing of received event JSON.

The canonical JSON examples are the Matrix specification's (appendices, "Canonical JSON").
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from factstream_events.rules.canonical import (
    MAX_CANONICAL_INT,
    MIN_CANONICAL_INT,
    CanonicalJsonError,
    EventJsonError,
    canonical_json,
    parse_event_json,
)
from hypothesis import given
from hypothesis import strategies as st

# ---------------------------------------------------------------------------------------------------------
# canonical_json

SPEC_EXAMPLES = [
    ("{}", "{}"),
    ('{"one": 1, "two": "Two"}', '{"one":1,"two":"Two"}'),
    ('{\n  "b": "2",\n  "a": "1"\n}', '{"a":"1","b":"2"}'),
    ('{"b":"2","a":"1"}', '{"a":"1","b":"2"}'),
    (
        '{"auth": {"success": true, "mxid": "@john.doe:example.com", "profile": {"display_name": "John Doe",'
        ' "three_pids": [{"medium": "email", "address": "john.doe@example.org"},'
        ' {"medium": "msisdn", "address": "123456789"}]}}}',
        '{"auth":{"mxid":"@john.doe:example.com","profile":{"display_name":"John Doe","three_pids":'
        '[{"address":"john.doe@example.org","medium":"email"},{"address":"123456789","medium":"msisdn"}]},'
        '"success":true}}',
    ),
    ('{"a": "日本語"}', '{"a":"日本語"}'),
    ('{"本": 2, "日": 1}', '{"日":1,"本":2}'),
    ('{"a": "\\u65E5"}', '{"a":"日"}'),
    ('{"a": null}', '{"a":null}'),
]


@pytest.mark.parametrize(("given_json", "expected"), SPEC_EXAMPLES)
def test_spec_examples(given_json: str, expected: str) -> None:
    assert canonical_json(json.loads(given_json)) == expected.encode("utf-8")


def test_keys_sorted_by_code_point_not_utf16() -> None:
    # U+E000 < U+1F600 by code point; in UTF-16 the emoji's high surrogate (0xD83D) would sort first.
    value = {"\U0001f600": 2, "\ue000": 1, "b": 0, "B": 0, "a": 0}
    assert canonical_json(value) == '{"B":0,"a":0,"b":0,"\ue000":1,"\U0001f600":2}'.encode()


def test_unicode_is_written_as_utf8_not_escaped() -> None:
    assert canonical_json({"name": "Ünïcødé 😀"}) == b'{"name":"\xc3\x9cn\xc3\xafc\xc3\xb8d\xc3\xa9 \xf0\x9f\x98\x80"}'


def test_only_required_escapes() -> None:
    value = ["\x00", "\x01", "\x1f", "\b\f\n\r\t", '"', "\\", "/", "\x7f", "\u2028", "é"]
    assert canonical_json(value) == (
        b'["\\u0000","\\u0001","\\u001f","\\b\\f\\n\\r\\t","\\"","\\\\","/","\x7f","\xe2\x80\xa8","\xc3\xa9"]'
    )


def test_no_whitespace_and_scalars() -> None:
    value = {"t": True, "f": False, "n": None, "list": [1, [], {}], "neg": -5, "zero": 0}
    assert canonical_json(value) == b'{"f":false,"list":[1,[],{}],"n":null,"neg":-5,"t":true,"zero":0}'


def test_tuples_are_arrays() -> None:
    assert canonical_json({"a": (1, "x")}) == b'{"a":[1,"x"]}'


def test_integer_range_bounds_accepted() -> None:
    assert canonical_json([MAX_CANONICAL_INT, MIN_CANONICAL_INT]) == b"[9007199254740991,-9007199254740991]"
    assert MAX_CANONICAL_INT == 2**53 - 1
    assert MIN_CANONICAL_INT == -(2**53) + 1


@pytest.mark.parametrize(
    ("value", "path", "what"),
    [
        ({"content": {"n": 1.5}}, "content.n", "float"),
        ({"content": {"n": 1.0}}, "content.n", "float"),
        ({"depth": float("nan")}, "depth", "not a JSON number"),
        ({"depth": float("inf")}, "depth", "not a JSON number"),
        ({"content": {"n": -float("inf")}}, "content.n", "not a JSON number"),
        ({"depth": 2**53}, "depth", "outside the range"),
        ({"depth": -(2**53)}, "depth", "outside the range"),
        ({"prev_events": ["$a", 10**30]}, "prev_events[1]", "outside the range"),
        ({"content": {"a": [{"b": 0.1}]}}, "content.a[0].b", "float"),
    ],
)
def test_refused_numbers_name_the_path(value: object, path: str, what: str) -> None:
    with pytest.raises(CanonicalJsonError) as caught:
        canonical_json(value)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert what in message


def test_top_level_float_refused() -> None:
    with pytest.raises(CanonicalJsonError, match="the top-level value"):
        canonical_json(2.5)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"content": {1: "x"}}, "content: the key 1 is not a string"),
        ({"content": {"s": {1, 2}}}, "content.s: a set has no JSON form"),
        ({"content": {"b": b"raw"}}, "content.b: a bytes has no JSON form"),
        ({"content": {"s": "\ud800"}}, "content.s: the string holds an unpaired surrogate U+D800"),
        ({"content": {"\udfff": 1}}, "content: the key"),
    ],
)
def test_values_without_canonical_form_refused(value: object, fragment: str) -> None:
    with pytest.raises(CanonicalJsonError) as caught:
        canonical_json(value)
    assert fragment in str(caught.value)


def test_canonical_json_error_is_a_value_error() -> None:
    assert issubclass(CanonicalJsonError, ValueError)


# Generated JSON values within canonical JSON's domain (st.text() never yields lone surrogates).
canonical_ints = st.integers(min_value=MIN_CANONICAL_INT, max_value=MAX_CANONICAL_INT)
json_scalars = st.none() | st.booleans() | canonical_ints | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@given(json_values)
def test_round_trips_through_json(value: Any) -> None:
    assert json.loads(canonical_json(value)) == value


@given(json_values)
def test_is_a_fixed_point(value: Any) -> None:
    encoded = canonical_json(value)
    assert canonical_json(json.loads(encoded)) == encoded


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys inserted in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@given(json_values, st.randoms(use_true_random=False))
def test_independent_of_key_insertion_order(value: Any, rng: random.Random) -> None:
    assert canonical_json(_shuffled(value, rng)) == canonical_json(value)


# ---------------------------------------------------------------------------------------------------------
# parse_event_json


def test_parses_bytes_and_str() -> None:
    expected = {"type": "m.room.message", "content": {"body": "日本語"}}
    assert parse_event_json('{"type":"m.room.message","content":{"body":"日本語"}}'.encode()) == expected
    assert parse_event_json('{"type": "m.room.message", "content": {"body": "\\u65e5\\u672c\\u8a9e"}}') == expected


def test_large_integers_and_floats_are_accepted() -> None:
    event = parse_event_json(b'{"depth": 123456789012345678901234567890, "content": {"f": 1.5, "e": -2e-3}}')
    assert event["depth"] == 123456789012345678901234567890
    assert event["content"] == {"f": 1.5, "e": -0.002}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"type": "a", "type": "b"}', "duplicate key 'type' at the top level"),
        (b'{"content": {"body": "x", "body": "y"}}', "duplicate key 'body' in content"),
        (b'{"content": {"a": [{"k": 1, "k": 2}]}}', "duplicate key 'k' in content.a[0]"),
    ],
)
def test_duplicate_keys_refused_at_any_depth(data: bytes, message: str) -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(data)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("data", "path", "constant"),
    [
        (b'{"content": {"n": NaN}}', "content.n", "NaN"),
        (b'{"depth": Infinity}', "depth", "Infinity"),
        (b'{"prev_events": [1, -Infinity]}', "prev_events[1]", "-Infinity"),
    ],
)
def test_nan_and_infinity_refused(data: bytes, path: str, constant: str) -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(data)
    assert str(caught.value).startswith(f"{path}: {constant} is not a JSON number")


@pytest.mark.parametrize(
    "data",
    [
        b'{"content": {"body": "a\\u0000b"}}',  # escaped
        b'{"content": {"body": "a\x00b"}}',  # raw NUL byte inside the string
    ],
)
def test_nul_in_a_string_refused_with_its_path(data: bytes) -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(data)
    assert str(caught.value).startswith("content.body contains a NUL character")


def test_nul_in_a_key_refused() -> None:
    with pytest.raises(EventJsonError, match=re.escape("the key 'content.a\\x00' contains a NUL character")):
        parse_event_json(b'{"content": {"a\\u0000": 1}}')


def test_raw_nul_outside_strings_refused() -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(b'{"a": 1}\x00')
    assert str(caught.value) == "not valid JSON: Extra data: line 1 column 9 (char 8) (a NUL byte is at character 8)"


def test_unpaired_surrogate_refused() -> None:
    with pytest.raises(EventJsonError, match=re.escape("content.body contains an unpaired surrogate U+D83D")):
        parse_event_json(b'{"content": {"body": "\\ud83d"}}')


@pytest.mark.parametrize(
    ("data", "kind"),
    [(b"[1, 2]", "an array"), (b'"event"', "a string"), (b"42", "a number"), (b"null", "null"), (b"true", "a boolean")],
)
def test_non_object_refused(data: bytes, kind: str) -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(data)
    assert str(caught.value) == f"an event must be a JSON object, not {kind}"


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (b'{"a": "\xff"}', 7),
        (b'{"a": "\xc3"}', 7),  # truncated two-byte sequence
        (b'{"a": "\xed\xa0\x80"}', 7),  # an encoded surrogate is not UTF-8
    ],
)
def test_invalid_utf8_refused(data: bytes, offset: int) -> None:
    with pytest.raises(EventJsonError) as caught:
        parse_event_json(data)
    message = str(caught.value)
    assert message.startswith("not valid UTF-8: ")
    assert message.endswith(f"at byte offset {offset}")


@pytest.mark.parametrize("data", [b"", b'{"a": ', b"{'a': 1}", b'{"a": 1,}', b'{"a": 1} {}', b"\xef\xbb\xbf{}"])
def test_malformed_json_refused(data: bytes) -> None:
    with pytest.raises(EventJsonError, match=r"^not valid JSON: "):
        parse_event_json(data)


def test_deep_nesting_refused_not_crashing() -> None:
    with pytest.raises(EventJsonError, match="nested too deeply"):
        parse_event_json(b"[" * 200_000 + b"]" * 200_000)


def test_other_input_types_are_a_type_error() -> None:
    with pytest.raises(TypeError):
        parse_event_json(12)  # type: ignore[arg-type]


def test_event_json_error_is_a_value_error() -> None:
    assert issubclass(EventJsonError, ValueError)


@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_parses_what_canonical_json_writes(value: dict[str, Any]) -> None:
    text = canonical_json(value)
    if b"\\u0000" in text:
        with pytest.raises(EventJsonError, match="NUL"):
            parse_event_json(text)
    else:
        assert parse_event_json(text) == value
