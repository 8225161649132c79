"""``factstream demo`` on a fresh copy of the repository, with nothing configured: the embedded
defaults, no ``FACTSTREAM_*`` variables, no configuration file, the state directory inside the copy.

One full run (story and Spark export) is shared by the assertions on what the story guarantees; the
Ctrl-C and ``--keep-running`` tests (the latter without the export) then run the demo again in the
same copy, so a second and a third run, on the database and export the first one left, are exercised
too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from factstream.demo.cluster import user_id
from factstream.demo.story import AFTER_CAROL, BEFORE_CAROL
from tests import class_archive

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"instances started: main \S+ \(pid (\d+)\), worker \S+ \(pid (\d+)\)")


@dataclass
class Copy:
    root: Path
    env: dict[str, str]

    @property
    def state_dir(self) -> Path:
        return self.root / ".factstream"

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "factstream", "demo", *args],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@dataclass
class Run:
    rc: int
    output: str
    seconds: float


def fresh_copy(dest: Path) -> Copy:
    """The tracked and untracked-not-ignored files of the repository, as a fresh clone has them; the
    worktree's interpreter runs the copy's code (its framework and plugins first on ``PYTHONPATH``)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    paths = [dest / "framework", *sorted(p for p in (dest / "plugins").iterdir() if p.is_dir())]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTSTREAM_")}
    env |= {"PYTHONPATH": os.pathsep.join(map(str, paths)), "PYTHONUNBUFFERED": "1"}
    return Copy(dest, env)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie that nobody reaped yet is gone for this purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[-1][:1] != "Z"


def processes_using(path: Path) -> list[str]:
    """Command lines of running processes that name ``path`` (the copy: its state dir, its config)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline and "pytest" not in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def assert_nothing_left(copy: Copy, pids: list[int]) -> None:
    deadline = time.monotonic() + 10  # the embedded server's last backends may take a moment
    while True:
        left = [p for p in pids if alive(p)]
        users = processes_using(copy.root)
        if not left and not users:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left running: pids {left}; processes naming the copy: {users}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def copy() -> Iterator[Copy]:
    # Not under pytest's temporary root: as root, the demo's embedded PostgreSQL runs as another user,
    # and every pytest session that starts (a test's own pytest run, in another worker) makes
    # /tmp/pytest-of-root private again (0700), which cut a demo's server off from its data (seen in CI).
    root = Path(tempfile.mkdtemp(prefix="factstream-demo-clone-"))
    c = fresh_copy(root)
    try:
        yield c
    finally:
        for line in processes_using(c.root):  # only after a failure: do not leave them to other tests
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def full_run(copy: Copy) -> Run:
    started = time.monotonic()
    proc = copy.start()
    try:
        output, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        raise AssertionError(f"the demo did not finish in 420 s:\n{output}") from None
    return Run(proc.returncode, output, time.monotonic() - started)


@pytest.fixture(scope="module")
def summary(full_run: Run, copy: Copy) -> dict[str, Any]:
    assert full_run.rc == 0, full_run.output
    data: dict[str, Any] = json.loads((copy.state_dir / "demo" / "summary.json").read_text())
    return data


def exported(copy: Copy, job: str) -> list[dict[str, Any]]:
    table = ds.dataset(copy.state_dir / "demo" / "exports" / job, format="parquet", partitioning="hive").to_table()
    return list(table.to_pylist())


@pytest.mark.spark
class TestFullRun:
    def test_story_checks_pass_and_nothing_is_left(self, full_run: Run, summary: dict[str, Any], copy: Copy) -> None:
        assert all(summary["checks"].values()), summary["checks"]
        assert "Traceback" not in full_run.output
        pids = summary["pids"]["instances"]
        assert len(pids) == 2
        assert_nothing_left(copy, [*pids, summary["pids"]["export_group"]])
        with pytest.raises(ProcessLookupError):  # nothing in the export's group: Spark's JVM is gone
            os.killpg(summary["pids"]["export_group"], 0)
        assert not (copy.state_dir / "postgres" / "postmaster.pid").exists()

    def test_the_command_it_prints_to_read_the_files_works_in_a_plain_shell(self, full_run: Run) -> None:
        """Pasted as printed into a shell that has no virtual environment (only the system's PATH), in
        another directory: it prints the exported rows."""
        lines = full_run.output.splitlines()
        hint = next(i for i, line in enumerate(lines) if line.startswith("read them with pyarrow"))
        command = lines[hint + 1].strip()
        plain = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        done = subprocess.run(["bash", "-c", command], env=plain, cwd="/", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        assert done.stdout.startswith("[{'stream_id': ") and "'kind': 'ev'" in done.stdout, done.stdout[:500]

    def test_the_spark_shell_it_names_reads_the_files_with_the_line_it_prints(self, full_run: Run) -> None:
        """The named ``pyspark`` shell, started from a plain shell as printed, given the printed line: it
        shows the exported rows."""
        lines = full_run.output.splitlines()
        hint = next(i for i, line in enumerate(lines) if line.startswith("or in Spark's shell, started with:"))
        shell = lines[hint + 1].strip()
        statement = lines[hint + 2].removeprefix("then: ")
        plain = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        plain |= {k: os.environ[k] for k in ("JAVA_HOME",) if k in os.environ}
        plain["SPARK_SUBMIT_OPTS"] = class_archive.java_options(class_archive.archive_path())  # the suite's JVM flags
        # The shell is interactive in a terminal; from a pipe, Python is only when told (its start-up file,
        # which makes ``spark``, runs in interactive mode only).
        plain["PYSPARK_DRIVER_PYTHON_OPTS"] = "-i"
        done = subprocess.run(
            ["bash", "-c", shell],
            input=statement + "\n",
            env=plain,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{shell} < {statement}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        table = [line for line in done.stdout.splitlines() if line.startswith("|")]
        header = [cell.strip() for cell in table[0].strip("|").split("|")] if table else []
        assert header[:1] == ["stream_id"] and "kind" in header, done.stdout[-3000:]
        kinds = {row.strip("|").split("|")[header.index("kind")].strip() for row in table[1:]}
        assert "ev" in kinds, done.stdout[-3000:]

    def test_worker_saw_every_fact_once(self, summary: dict[str, Any]) -> None:
        main, worker = summary["positions"]["main"], summary["positions"]["worker"]
        streams = {"events", "backfill", "account_data", "to_device", "caches", "receipts", "typing", "presence"}
        assert set(main) == set(worker) == streams
        assert worker == main
        rec = summary["record"]
        received = rec["received_by_bob"]
        assert len(received) == len(set(received))  # each once
        assert [e for e in received if e in rec["expected_by_bob"]] == rec["expected_by_bob"]  # all, in order
        assert set(received) <= set(rec["room_event_ids"])

    def test_the_long_poll_woke(self, full_run: Run, summary: dict[str, Any]) -> None:
        wakes = summary["record"]["wakes"]
        assert sum(w["room_events"] for w in wakes) >= len(summary["record"]["expected_by_bob"])
        assert any(w["to_device"] for w in wakes) and any(w["account_data"] for w in wakes)
        assert re.search(r"/sync on worker: a long poll answered after a \d+ ms wait, 1 room event", full_run.output)
        assert len(summary["record"]["account_data_received"]) == 2
        # alice's typing (kept in main's memory), her stopping, and her read receipt reached bob on the worker
        typing = summary["record"]["typing_seen"]
        assert [user_id("alice")] in typing and typing.index([]) > typing.index([user_id("alice")])
        read = summary["record"]["messages"][AFTER_CAROL[1]]
        assert [read, "m.read", user_id("alice")] in summary["record"]["receipts_seen"]

    def test_late_joiner_cannot_see_before_the_join(self, full_run: Run, summary: dict[str, Any]) -> None:
        rec = summary["record"]
        for body in BEFORE_CAROL:
            assert body not in rec["carol_messages_bodies"] and body not in rec["carol_sync_bodies"]
        assert "welcome carol" not in rec["carol_messages_bodies"]  # read right after her join
        assert "carol, who joined late, could see 0 of the 3 messages before her join" in full_run.output

    def test_parquet_holds_exactly_the_facts_written(self, summary: dict[str, Any], copy: Copy) -> None:
        rec, main = summary["record"], summary["positions"]["main"]
        rows = exported(copy, "demo_events")
        ev = [json.loads(r["data"]) for r in rows if r["kind"] == "ev"]
        ids = [d[0] for d in ev]
        assert len(ids) == len(set(ids))
        assert set(ids) == set(rec["room_event_ids"]) | {rec["redaction_event_id"]}
        assert max(r["stream_id"] for r in rows) == main["events"]["main"]
        account = exported(copy, "demo_account_data")
        assert sorted(r["stream_id"] for r in account) == rec["account_data_positions"]
        # to-device messages live until acknowledged: the phone's was, the laptop's waits
        assert rec["to_device_stored"] == 2 and len(exported(copy, "demo_to_device")) == 1
        jobs = {e["job"]: e["rows"] for e in summary["exports"]}
        assert jobs["demo_events"] == len(rows) and jobs["demo_account_data"] == len(account)

    def test_the_redacted_message_is_exported_with_its_redaction(self, summary: dict[str, Any], copy: Copy) -> None:
        rec = summary["record"]
        ev = [json.loads(r["data"]) for r in exported(copy, "demo_events") if r["kind"] == "ev"]
        redactions = [d for d in ev if d[2] == "m.room.redaction"]
        assert [(d[0], d[4]) for d in redactions] == [(rec["redaction_event_id"], rec["redacted_event_id"])]
        assert rec["redacted_content_seen_by_bob"] == {}


def wait_for_line(proc: subprocess.Popen[str], pattern: str, lines: list[str], timeout: float = 180) -> re.Match[str]:
    """Read the demo's output until a line matches ``pattern``."""
    assert proc.stdout is not None
    found: list[re.Match[str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if m := re.search(pattern, line):
                found.append(m)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert found, f"no line matching {pattern!r} within {timeout:.0f} s:\n{''.join(lines)}"
    return found[0]


@contextlib.contextmanager
def demo_process(copy: Copy, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """The demo running with ``args``, and the lines it printed so far; killed if still running at the end."""
    proc = copy.start(*args)
    try:
        yield proc, []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def interrupt(proc: subprocess.Popen[str], lines: list[str]) -> str:
    """SIGINT the demo and wait for its exit; returns all it printed."""
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    return "".join(lines) + rest


@pytest.mark.spark
def test_ctrl_c_stops_everything(copy: Copy) -> None:
    """SIGINT once the instances started (Spark is starting meanwhile): exit 130, the instances, Spark's
    JVM and the embedded server stopped."""
    with demo_process(copy) as (proc, lines):
        spark = int(wait_for_line(proc, r"Spark starting .*process group (\d+)", lines).group(1))
        m = wait_for_line(proc, STARTED.pattern, lines)
        output = interrupt(proc, lines)
    assert proc.returncode == 130, output
    assert [line for line in output.splitlines() if "interrupted" in line] == [
        "interrupted: the demo's processes are stopped"
    ], output  # one line, not the demo's and then the CLI's
    assert "Traceback" not in output
    assert_nothing_left(copy, [int(m.group(1)), int(m.group(2)), spark])
    with pytest.raises(ProcessLookupError):
        os.killpg(spark, 0)


def curl_request(command: str) -> urllib.request.Request:
    """The request a printed ``curl`` command makes (its -X, -H, -d and URL)."""
    words = shlex.split(command)
    assert words[0] == "curl"
    method, headers, data, url = "GET", {}, None, ""
    it = iter(words[1:])
    for word in it:
        if word == "-X":
            method = next(it)
        elif word == "-H":
            key, _, value = next(it).partition(": ")
            headers[key] = value
        elif word == "-d":
            data = next(it).encode()
        elif not word.startswith("-"):
            url = word
    return urllib.request.Request(url, data=data, method=method, headers=headers)


def test_keep_running_serves_the_printed_commands(copy: Copy) -> None:
    with demo_process(copy, "--keep-running", "--no-export") as (proc, lines):
        m = wait_for_line(proc, STARTED.pattern, lines)
        sync = wait_for_line(proc, r"^(curl .*/sync\?.*)$", lines).group(1)
        send = wait_for_line(proc, r"^(curl -s -X PUT .*)$", lines).group(1)
        token_command = wait_for_line(proc, r"^(\S+/factstream -c .* tokens create .*)$", lines).group(1)
        dashboard = wait_for_line(proc, r"^dashboard \(the deployment, live\): (\S+)$", lines).group(1)
        wait_for_line(proc, "Ctrl-C", lines, timeout=10)

        # The token command, pasted into a shell without the environment, makes a token the worker takes.
        plain = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        made = subprocess.run(["bash", "-c", token_command], env=plain, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, f"{token_command}\n{made.stdout}{made.stderr}"
        own = made.stdout.strip()  # the new token, alone on stdout
        worker = shlex.split(sync)[-1].split("/sync")[0]
        as_bob = urllib.request.Request(f"{worker}/sync?timeout=0", headers={"Authorization": f"Bearer {own}"})
        assert urllib.request.urlopen(as_bob, timeout=10).status == 200
        assert urllib.request.urlopen(dashboard, timeout=10).status == 200

        answer: list[dict[str, Any]] = []
        poll = threading.Thread(
            target=lambda: answer.append(json.load(urllib.request.urlopen(curl_request(sync), timeout=40)))
        )
        poll.start()
        time.sleep(0.5)  # the long poll waits on the worker
        sent = json.load(urllib.request.urlopen(curl_request(send), timeout=10))
        poll.join(40)
        assert answer, "the printed /sync long poll did not answer"
        events = [e for room in answer[0]["rooms"]["join"].values() for e in room["timeline"]["events"]]
        assert [e["event_id"] for e in events] == [sent["event_id"]]
        assert events[0]["content"]["body"] == "hello from curl"
        output = interrupt(proc, lines)
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    assert_nothing_left(copy, [int(m.group(1)), int(m.group(2))])


def test_missing_plugins_are_named(copy: Copy) -> None:
    """Without a plugin the story needs, the demo says which and how to get it, and starts nothing."""
    env = copy.env | {"FACTSTREAM_BLOCK_PLUGINS": "to_device"}
    result = subprocess.run(
        [sys.executable, "-m", "factstream", "demo"], cwd=copy.root, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "not loaded: to_device" in result.stderr and "uv sync --all-packages" in result.stderr
    assert "Traceback" not in result.stderr
