"""mypy checks a rows handler against its stream, and a plugin hook's caller against the hook's spec.

A plugin written against the public API is type-checked as a plugin author's CI would (``mypy
--strict``): each line marked ``# error`` below must be reported, and nothing else.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = '''
from __future__ import annotations

from collections.abc import Sequence

import msgspec

import factstream
from factstream import HostApi, RegisterRowsHandler, RegisterStream, RowsHandlerSpec, StreamSpec, StreamTable, Wake


class LikeRow(msgspec.Struct, frozen=True):
    user_id: str


class NoteRow(msgspec.Struct, frozen=True):
    author: str


LIKES = StreamSpec(name="likes", row_type=LikeRow, tables=(StreamTable("likes", "instance_name", "stream_id"),))


def on_likes(host: HostApi, instance: str, token: int, rows: Sequence[LikeRow], local: bool) -> None:
    pass


async def on_likes_later(host: HostApi, instance: str, token: int, rows: Sequence[LikeRow], local: bool) -> None:
    pass


def on_any_rows(host: HostApi, instance: str, token: int, rows: Sequence[msgspec.Struct], local: bool) -> None:
    pass


def on_notes(host: HostApi, instance: str, token: int, rows: Sequence[NoteRow], local: bool) -> None:
    pass


def wake_note(row: NoteRow) -> Wake:
    return Wake(users=(row.author,))


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(LIKES)
    register(StreamSpec(name="notes", row_type=LikeRow, tables=LIKES.tables, wake=wake_note))  # error


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler) -> None:
    register(RowsHandlerSpec(stream=LIKES, handler=on_likes))
    register(RowsHandlerSpec(stream=LIKES, handler=on_likes_later))
    register(RowsHandlerSpec(stream=LIKES, handler=on_any_rows))
    register(RowsHandlerSpec(stream=LIKES, handler=on_notes))  # error
    register(LIKES)  # error


class LikeHooks:
    @staticmethod
    @factstream.hookspec(firstresult=True)
    def like_limit(host: HostApi, target: str) -> int | None:
        """How many likes ``target`` may get."""


async def ask(host: HostApi) -> None:
    limit: int | None = await host.call_first(LikeHooks.like_limit, host=host, target="post:1")
    every: list[int | None] = await host.call_hook(LikeHooks.like_limit, host=host, target="post:1")
    wrong: str | None = await host.call_first(LikeHooks.like_limit, host=host, target="post:1")  # error
    await host.call_first(LikeHooks.like_limit, host=host, taget="post:1")  # error
'''


def test_mypy_refuses_a_handler_of_another_row_type_and_a_hook_call_off_its_spec(tmp_path: Path) -> None:
    source = textwrap.dedent(PLUGIN).lstrip()
    (tmp_path / "likes_plugin.py").write_text(source)
    expected = {n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# error")}

    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--show-error-codes", "likes_plugin.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )

    errors = re.findall(r"^likes_plugin\.py:(\d+): error: (.*)$", result.stdout, re.MULTILINE)
    assert {int(line) for line, _ in errors} == expected, result.stdout
    assert result.returncode == 1, result.stdout + result.stderr
