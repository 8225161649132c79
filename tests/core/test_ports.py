"""Ports for servers configured before they start: ``free_port()`` and the ranges of parallel test runs.

Under pytest-xdist each worker draws from a range of its own (``FACTSTREAM_PORTS``, set by the test
plugin), so two workers never configure servers on the same port, whatever the order they start them in.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream import sockets
from factstream.sockets import PORTS_ENV, free_port, port_range
from factstream.testing import PORTS_PER_WORKER, worker_ports


@given(st.integers(0, 14), st.integers(0, 14))
def test_two_workers_ports_never_overlap_and_stay_below_the_kernels_own(a: int, b: int) -> None:
    first, second = (port_range(worker_ports(f"gw{n}") or "") for n in (a, b))
    assert len(first) == PORTS_PER_WORKER
    assert first.stop - 1 < 32768  # Linux hands out ephemeral ports from 32768
    if a != b:
        assert not set(first) & set(second)


def test_outside_xdist_there_is_no_range() -> None:
    assert worker_ports("") is None
    assert worker_ports("master") is None


def test_free_port_draws_from_the_range_and_never_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORTS_ENV, "20100-20109")
    monkeypatch.setattr(sockets, "_handed_out", set())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 20105))  # somebody listens there already
        taken.listen()
        ports = [free_port() for _ in range(9)]
        with pytest.raises(OSError, match="FACTSTREAM_PORTS=20100-20109"):
            free_port()
    assert sorted(ports) == [p for p in range(20100, 20110) if p != 20105]


@pytest.mark.parametrize("text", ["20000", "20000-", "a-b", "100-200", "30000-20000", "60000-70000"])
def test_a_malformed_range_is_an_error_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=PORTS_ENV):
        port_range(text)


def test_the_worker_s_range_reaches_the_processes_it_starts() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    script = "import os; from factstream.sockets import free_port as f; print(os.environ.get('FACTSTREAM_PORTS'), f())"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    if worker is None:
        assert out[0] == os.environ.get(PORTS_ENV, "None")
    else:
        assert out[0] == worker_ports(worker)
        assert int(out[1]) in port_range(out[0])
