"""``factstream demo``: the main job at work, on the embedded defaults.

It creates a fresh ``factstream_demo`` database on the embedded PostgreSQL under the state directory,
starts ``main`` and ``worker`` as real ``factstream run`` processes replicating over TCP
(:mod:`factstream.demo.cluster`), plays a scripted story through the public HTTP API
(:mod:`factstream.demo.story`) while a live view shows the streams, the replication lag, the cache
invalidations and the worker's ``/sync`` long poll (:mod:`factstream.demo.view`), exports every stream
to Parquet with Spark (:mod:`factstream.demo.export`, a process of its own), prints a summary and stops
everything. Ctrl-C at any moment stops the instances, Spark and the embedded server.

Everything it writes is under ``<state_dir>/demo/``: ``factstream.yaml`` (the generated
configuration), ``main.log``, ``worker.log``, ``export.log``, ``exports/`` and ``summary.json`` (what
the story recorded and the export wrote, for a test or a curious reader).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from factstream.demo.client import Client, path
from factstream.demo.cluster import DEMO_DATABASE, DemoCluster, DemoError, user_id
from factstream.demo.story import BEFORE_CAROL, BOB_DEVICE, Record, Story
from factstream.demo.view import Board, Monitor, positions_table, render

if TYPE_CHECKING:
    from factstream.plugin.manager import PluginHost

EXPORT_TIMEOUT = 240.0
#: The plugins whose routes the story uses.
NEEDED_PLUGINS = ("events", "to_device", "account_data", "typing", "receipts")
#: Seconds between the story's steps in the live view (a person watches it).
LIVE_PACE = 0.6
#: How lines a user may copy are printed: never wrapped, no markup or highlighting.
PLAIN: dict[str, Any] = {"highlight": False, "soft_wrap": True, "markup": False}


def own_token_command(config: Path, user: str) -> str:
    """The command that stores a new token for ``user`` in the demo's database, pasteable in the user's
    own shell: this environment's ``factstream`` by its absolute path, the demo's configuration named."""
    factstream = Path(sys.executable).parent / "factstream"
    return f"{shlex.quote(str(factstream))} -c {shlex.quote(str(config))} tokens create {shlex.quote(user)}"


def read_parquet_command(output: str) -> str:
    """A shell command that prints the rows of the Parquet under ``output``, pasteable in the user's own
    shell after the demo: this environment's interpreter by its absolute path (a shell's ``python`` may
    not exist, or may lack pyarrow, which only this environment is sure to have), everything quoted."""
    code = f"import pyarrow.parquet as pq; print(pq.read_table({json.dumps(output)}).to_pylist())"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


class Demo:
    def __init__(self, state_dir: Path, plugins: PluginHost, out: Console, *, export: bool = True) -> None:
        self.cluster = DemoCluster(state_dir)
        self.plugins = plugins
        self.out = out
        self.live_view = out.is_terminal
        self.board = Board(plain=None if self.live_view else self.plain)
        self.export_proc: subprocess.Popen[bytes] | None = None
        self.export_wanted = export
        #: The export's process group (its PID): Spark's JVM is in it too.
        self.export_pgid: int | None = None
        self.started = time.monotonic()

    def plain(self, line: str) -> None:
        self.out.print(f"[{time.monotonic() - self.started:5.1f}s] {line}", highlight=False, soft_wrap=True)

    def step(self, line: str) -> None:
        """A step outside the live view: printed either way."""
        if self.live_view:
            self.out.print(f"[green]✓[/green] {line}", highlight=False, soft_wrap=True)
        else:
            self.plain(line)

    # -- the phases --------------------------------------------------------------------------------------

    def start(self) -> None:
        c = self.cluster
        with self.out.status("starting the embedded PostgreSQL..."):
            c.prepare_database()
        self.step(f"database {DEMO_DATABASE} created afresh (embedded PostgreSQL under {c.state_dir})")
        with self.out.status("migrating every branch..."):
            c.migrate(self.plugins)
        c.write_config()
        self.step(f"configuration written to {c.config_path}")
        if self.export_wanted:
            self.start_export()
            self.step(f"Spark starting for the export, in the background (process group {self.export_pgid})")
        with self.out.status("starting main and worker..."):
            c.start()
        self.step(
            f"instances started: main {c.main.url} (pid {c.main.popen.pid if c.main.popen else '-'}), "
            f"worker {c.worker.url} (pid {c.worker.popen.pid if c.worker.popen else '-'}), replicating over TCP"
        )

    def play(self) -> Record:
        c = self.cluster
        server = c.tokens["server"]
        clients = {i.name: (Client(i.url, server, who="server"), Client(i.url)) for i in c.instances.values()}
        monitor = Monitor(self.board, clients)
        monitor.poll()
        story = Story(c, self.board, monitor, pace=LIVE_PACE if self.live_view else 0.0)
        monitor.start()
        try:
            if self.live_view:
                with Live(
                    render(self.board),
                    console=self.out,
                    refresh_per_second=8,
                    get_renderable=lambda: render(self.board),
                ):
                    record = story.play()
                    monitor.poll()
                    time.sleep(0.3)
            else:
                record = story.play()
                snapshot = monitor.poll()
                self.out.print(positions_table(snapshot))
                for inst in snapshot.instances.values():
                    self.plain(
                        f"{inst.name}: {inst.invalidations:.0f} cache invalidations applied, "
                        f"{inst.wakeups:.0f} /sync wake-ups"
                    )
        finally:
            monitor.stop()
            story.watcher.stopping.set()
        self.snapshot = monitor.poll()
        return record

    def start_export(self) -> None:
        """Start the export process: Spark starts while the instances start and the story plays."""
        c = self.cluster
        self.export_output = c.workdir / "exports"
        shutil.rmtree(self.export_output, ignore_errors=True)
        self.export_log = c.workdir / "export.log"
        cmd = [sys.executable, "-m", "factstream.demo.export", str(c.config_path), str(self.export_output)]
        with open(self.export_log, "wb") as log:
            self.export_proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.PIPE,
                env=c.env(),
                start_new_session=True,  # its own process group, Spark's JVM included: stopped as one
            )
        self.export_pgid = self.export_proc.pid

    def export(self) -> list[dict[str, Any]]:
        proc = self.export_proc
        assert proc is not None and proc.stdin is not None
        with self.out.status("exporting every stream to Parquet with Spark..."):
            started = time.monotonic()
            try:
                stdout, _ = proc.communicate(b"go\n", timeout=EXPORT_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise DemoError(
                    f"the export did not finish within {EXPORT_TIMEOUT:.0f} s; see {self.export_log}"
                ) from None
        if proc.returncode != 0:
            tail = "\n".join(self.export_log.read_text(errors="replace").splitlines()[-15:])
            raise DemoError(f"the export failed (status {proc.returncode}); the end of {self.export_log}:\n{tail}")
        stop_group(proc, terminate=False)  # Spark's JVM leaves after its Python driver: wait for it
        self.export_proc = None
        self.plain(f"Spark export done in {time.monotonic() - started:.1f} s (Spark started during the story)")
        return [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]

    def summary(self, record: Record, exports: list[dict[str, Any]]) -> None:
        c, out = self.cluster, self.out
        hidden = [b for b in BEFORE_CAROL if b not in record.carol_messages_bodies + record.carol_sync_bodies]
        counts = {e: record.received_by_bob.count(e) for e in record.expected_by_bob}
        once = all(n == 1 for n in counts.values()) and len(record.received_by_bob) == len(set(record.received_by_bob))
        ms = sorted(record.write_to_wake_ms)
        median = ms[len(ms) // 2] if ms else 0.0
        checks = {
            "worker_caught_up": all(
                max(v.positions.values(), default=0) >= self.snapshot.writer_position(s)
                for s, v in self.snapshot.instances["worker"].streams.items()
            ),
            "bob_received_each_event_once": once and set(counts) <= set(record.received_by_bob),
            "long_poll_woke": bool(record.wakes),
            "late_joiner_saw_nothing_before_join": len(hidden) == len(BEFORE_CAROL),
            "redacted_content_empty": record.redacted_content_seen_by_bob == {},
            "typing_reached_worker": [user_id("alice")] in record.typing_seen and [] in record.typing_seen,
            "receipt_reached_worker": any(r[2] == user_id("alice") for r in record.receipts_seen),
        }
        lines = [
            f"bob's /sync on the worker brought each of the {len(counts)} events written after his first sync "
            "exactly once"
            if checks["bob_received_each_event_once"]
            else "bob's /sync on the worker did NOT bring every event exactly once",
            f"the long poll woke {len(record.wakes)} times; from a write on main to bob's /sync on the worker: "
            f"median {median:.0f} ms, max {ms[-1] if ms else 0:.0f} ms",
            f"carol, who joined late, could see {len(BEFORE_CAROL) - len(hidden)} of the {len(BEFORE_CAROL)} "
            "messages before her join",
        ]
        for line in lines:
            self.plain(line) if not self.live_view else out.print(line, highlight=False)
        if exports:
            table = Table(title="Spark export (every stream, as written)")
            for col in ("job", "stream", "rows written", "seconds"):
                table.add_column(col, justify="right" if col in ("rows written", "seconds") else "left")
            for e in exports:
                table.add_row(e["job"], e["stream"], f"{e['rows']:,}", f"{e['seconds']:.1f}")
            out.print(table)
            first = next((e for e in exports if e["stream"] == "events"), exports[0])
            where = Path(first["output"]).parent
            out.print(f"Parquet files: {where}/<job>/export_range=<from>-<upto>/part-*.parquet", **PLAIN)
            out.print("read them with pyarrow, which this environment's Python has, from any shell:", **PLAIN)
            out.print(f"  {read_parquet_command(first['output'])}", **PLAIN)
            # The pyspark script runs `python3` from PATH unless told which Python to use (a plain shell's
            # has no pyspark).
            python, pyspark = (shlex.quote(str(Path(sys.executable).parent / name)) for name in ("python", "pyspark"))
            out.print("or in Spark's shell, started with:", **PLAIN)
            out.print(f"  PYSPARK_PYTHON={python} {pyspark}", **PLAIN)
            out.print(f'then: spark.read.parquet("{first["output"]}").show()', **PLAIN)
        data = {
            "checks": checks,
            "record": asdict(record),
            "exports": exports,
            "positions": {
                name: {s: v.positions for s, v in inst.streams.items()}
                for name, inst in self.snapshot.instances.items()
            },
            "config": str(c.config_path),
            "pids": {"instances": c.pids(), "export_group": self.export_pgid},
        }
        (c.workdir / "summary.json").write_text(json.dumps(data, indent=1))
        self.plain(f"summary written to {c.workdir / 'summary.json'}")
        failed = [k for k, ok in checks.items() if not ok]
        if failed:
            raise DemoError(f"the story's checks failed: {', '.join(failed)}; see {c.workdir / 'summary.json'}")

    def hints(self, record: Record) -> None:
        c, tok = self.cluster, self.cluster.tokens
        send = (
            f"curl -s -X PUT -H {shlex.quote('Authorization: Bearer ' + tok['alice'])} "
            f'-d \'{{"msgtype": "m.text", "body": "hello from curl"}}\' '
            f"{shlex.quote(c.main.url + path('rooms', record.room_id, 'send', 'm.room.message', 'curl1'))}"
        )
        sync = (
            f"curl -s -H {shlex.quote('Authorization: Bearer ' + tok['bob'])} "
            f"{shlex.quote(c.worker.url + '/sync?since=' + record.next_batch + '&timeout=30000&device=' + BOB_DEVICE)}"
        )
        out = self.out
        out.print("\n[bold]The instances keep running.[/bold] Try, in another terminal:", highlight=False)
        out.print("# long-poll /sync on the worker as bob (it waits for the next message):", highlight=False)
        out.print(sync, **PLAIN)
        out.print("# send a message to the demo room on main as alice:", highlight=False)
        out.print(send, **PLAIN)
        out.print(
            "# a token of your own for bob (the instances look tokens up in the demo's database):", highlight=False
        )
        out.print(own_token_command(c.config_path, user_id("bob")), **PLAIN)
        out.print(f"dashboard (the deployment, live): {c.worker.url}/dashboard", highlight=False, soft_wrap=True)
        out.print(f"metrics: {c.main.url}/metrics  {c.worker.url}/metrics", highlight=False, soft_wrap=True)
        out.print(
            f"tokens ({user_id('alice')}, bob, carol, a writer) and ports: {c.config_path}",
            highlight=False,
            soft_wrap=True,
        )
        out.print(
            "Press Ctrl-C here to stop them; the demo's database (and a token made above) lasts only as long.",
            highlight=False,
        )

    def wait_forever(self) -> None:
        while all(i.popen is not None and i.popen.poll() is None for i in self.cluster.instances.values()):
            time.sleep(0.5)
        raise DemoError(
            "an instance exited; see " + ", ".join(str(i.log_path) for i in self.cluster.instances.values())
        )

    def close(self) -> None:
        """Stop the export (its process group: Spark's JVM too), the instances, the embedded server."""
        proc = self.export_proc
        if proc is not None:
            stop_group(proc)
        self.cluster.stop()


def stop_group(proc: subprocess.Popen[bytes], *, terminate: bool = True) -> None:
    """Stop ``proc`` and everything in its process group (the export: Spark's JVM with it): SIGTERM
    (unless ``terminate`` is false: they are leaving by themselves), up to 10 s for all of them to exit,
    then SIGKILL. Returns once the group is empty."""
    if terminate:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is None:
            time.sleep(0.05)
            continue
        try:
            os.killpg(proc.pid, 0)  # anyone left in the group (the JVM, after the Python driver)?
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # killed ones are reaped by whoever adopted them
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def run_demo(
    state_dir: Path, plugins: PluginHost, out: Console, *, keep_running: bool = False, export: bool = True
) -> None:
    """Run the demo (see the module docstring); a ``KeyboardInterrupt`` stops it and propagates."""
    missing = [name for name in NEEDED_PLUGINS if name not in plugins.plugins]
    if missing:
        raise DemoError(
            f"the demo needs the bundled plugins {', '.join(NEEDED_PLUGINS)}; not loaded: {', '.join(missing)}. "
            "Install them (in a checkout: uv sync --all-packages) and do not block them (FACTSTREAM_BLOCK_PLUGINS)."
        )
    demo = Demo(state_dir, plugins, out, export=export)
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored (`&`)
    try:
        demo.start()
        record = demo.play()
        exports = demo.export() if export else []
        demo.summary(record, exports)
        if keep_running:
            demo.hints(record)
            with contextlib.suppress(KeyboardInterrupt):
                demo.wait_forever()
            out.print("stopping...")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            demo.close()
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    demo.plain(f"demo finished in {time.monotonic() - demo.started:.1f} s; everything it started has stopped")
