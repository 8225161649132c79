"""``RowRecorder``: every row that each in-process host's rows handlers received (the ``row_recorder`` fixture).

A replication test asks what reached a host: which rows, written by whom, at which token, in what
order. The recorder answers as a plugin sees it. The ``row_recorder`` fixture installs, through
``plugin_installer`` like any other plugin, a one-module plugin (``PLUGIN_SOURCE``) whose rows
handler, registered for every stream, appends a :class:`RecordedRow` to the list of the host it runs
in; the fixture returns that plugin's :class:`RowRecorder`. A plugin's tests use it so::

    async def test_worker1_gets_the_likes_in_order(row_recorder, host_cluster):
        host_cluster.configure(stream_writers={"likes": ["main"]})
        main, worker = await host_cluster("main"), await host_cluster("worker1")
        await host_cluster.following(worker, "likes")
        ids = ...  # likes appended on main
        await until(lambda: len(row_recorder.rows("worker1", "likes")) == len(ids))
        assert [r.token for r in row_recorder.rows("worker1", "likes")] == ids

Two things follow from recording through a plugin. The recorder must be installed before a host
starts, since a host registers its rows handlers then: ask for the fixture in the test's signature, or
in the fixture that migrates the test's database. And it sees the hosts of this process only
(``host_cluster``), not ``factstream run`` processes. Each test has a recorder of its own: the plugin is
installed for one test and imported afresh by the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from factstream import HostApi, RegisterRowsHandler, RowsHandler, RowsHandlerSpec, StreamSpec

#: The recorder plugin's module (``__init__.py``): one :class:`RowRecorder`, named ``recorder``, whose
#: handlers it registers for every stream.
PLUGIN_SOURCE = """
import factstream
from factstream.testing.recorder import RowRecorder

recorder = RowRecorder()


@factstream.hookimpl
def register_rows_handlers(register, streams):
    recorder.register_handlers(register, streams)
"""


class RecordedRow(NamedTuple):
    """One row a host received: of ``stream``, written by instance ``writer`` at ``token``."""

    stream: str
    writer: str
    token: int
    row: Any


class RowRecorder:
    """The rows each host of this process received, per host, in the order its rows handlers saw them.

    The ``row_recorder`` fixture installs the plugin (``PLUGIN_SOURCE``) that makes one; :meth:`rows`
    reads it.
    """

    def __init__(self) -> None:
        self._received: dict[str, list[RecordedRow]] = {}

    def rows(self, instance: str, stream: str | None = None) -> list[RecordedRow]:
        """What host ``instance`` received so far (of ``stream`` only, when given), in arrival order:
        a copy, which later rows do not change."""
        return [r for r in self._received.get(instance, []) if stream is None or r.stream == stream]

    def register_handlers(self, register: RegisterRowsHandler, streams: Sequence[StreamSpec[Any]]) -> None:
        """The plugin's ``register_rows_handlers``: a handler recording every stream's rows."""
        for spec in streams:
            register(RowsHandlerSpec(stream=spec, handler=self._handler(spec.name)))

    def _handler(self, stream: str) -> RowsHandler[Any]:
        def record(host: HostApi, writer: str, token: int, rows: Sequence[Any], local: bool, /) -> None:
            self._received.setdefault(host.instance_name, []).extend(
                RecordedRow(stream, writer, token, row) for row in rows
            )

        return record
