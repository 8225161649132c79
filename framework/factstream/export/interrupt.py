"""Ending an export's Spark session, whether the export finishes, fails or is interrupted.

PySpark starts its gateway JVM (``spark-submit``) with SIGINT ignored, so that Ctrl-C interrupts only
Python; the JVM then waits for its parent to go, and one interrupted while it started was left
running (parent PID 1) for minutes. An interrupted call into the JVM also made py4j log some 50 lines
of tracebacks. Here SIGTERM is turned into the same ``KeyboardInterrupt`` as Ctrl-C, py4j's logging is
kept quiet, and on the way out the session is stopped (``spark.stop()``, given a few seconds) and the
JVM and what it started are killed if they still run. The caller (the CLI) then prints one line,
``interrupted``, and exits 130.

Once a signal has arrived, the export ends as interrupted whatever exception comes out: the
``KeyboardInterrupt`` can land in the middle of a py4j call, and a JVM call made on the way out on that
thread's connection (PySpark's own ``SCCallSiteSync.__exit__`` makes one) then fails with
``Py4JNetworkError`` ("Answer from Java side is empty"), which would replace it and read as a failed
run and an internal error. The checkpoints are not touched here: an interrupted range is either
uncommitted (removed by the next run) or committed before its checkpoint moved (adopted by it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

#: How long ``spark.stop()`` may take before the JVM is killed instead.
STOP_SECONDS = 10.0
#: The same after an interruption, which may have left py4j's connection in the middle of a command.
INTERRUPTED_STOP_SECONDS = 3.0


class SparkSessions:
    """The session an export started (``start``), stopped and its JVM killed by :func:`spark_stopped_on_exit`."""

    def __init__(self) -> None:
        self.spark: Any = None

    def start(self, master: str, conf: Mapping[str, str]) -> Any:
        from factstream.export.session import build_session

        self.spark = build_session(master, conf=conf)
        if threading.current_thread() is threading.main_thread():
            # PySpark's own SIGINT handler calls the JVM (cancelAllJobs) from inside the signal, in the
            # middle of the call the main thread is making: py4j then fails with a reentrant read and
            # logs it twice. A plain KeyboardInterrupt is enough: the JVM is stopped on the way out.
            signal.signal(signal.SIGINT, _interrupt)
        return self.spark

    def stop(self, *, interrupted: bool) -> None:
        spark, self.spark = self.spark, None
        if spark is not None:
            _stop_within(spark, INTERRUPTED_STOP_SECONDS if interrupted else STOP_SECONDS)
        kill_spark_processes()


def _stop_within(spark: Any, seconds: float) -> None:
    """``spark.stop()`` in a thread given ``seconds``: a JVM that no longer answers is killed after."""
    thread = threading.Thread(target=_quietly, args=(spark.stop,), name="spark-stop", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning("Spark did not stop within %.0f s; killing its JVM", seconds)


def _quietly(call: Any) -> None:
    try:
        call()
    except Exception:
        log.info("stopping Spark failed", exc_info=True)


def kill_spark_processes() -> list[int]:
    """Kill this process's descendants that belong to Spark (its gateway JVM, the scripts that start it,
    the Python workers it runs); returns their PIDs."""
    import psutil  # type: ignore[import-untyped]

    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    spark = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if any("spark" in arg.lower() for arg in child.cmdline()):
                spark.append(child)
    for proc in spark:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(spark, timeout=3)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=3)
    return [p.pid for p in spark]


#: Set by the handler when SIGINT or SIGTERM reaches an export (cleared as :func:`spark_stopped_on_exit` begins).
_signalled = threading.Event()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _signalled.set()
    raise KeyboardInterrupt


def signalled() -> bool:
    """Whether the export was interrupted by a signal: an exception after it is its consequence, not a
    failure of its own (module docstring)."""
    return _signalled.is_set()


class _Py4jRecords(logging.Filter):
    """Drops what py4j logs on the root logger (``logging.exception`` when a call is interrupted)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


@contextlib.contextmanager
def spark_stopped_on_exit() -> Iterator[SparkSessions]:
    """Run an export's Spark work; however it ends, no Spark process of ours is left (module docstring)."""
    sessions = SparkSessions()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None
    py4j = logging.getLogger("py4j")
    level = py4j.level
    py4j.setLevel(logging.CRITICAL)
    root_filter = _Py4jRecords()
    logging.getLogger().addFilter(root_filter)
    sigint = signal.getsignal(signal.SIGINT) if in_main else None
    interrupted = False
    _signalled.clear()
    try:
        yield sessions
    except KeyboardInterrupt:
        interrupted = True
        raise
    except BaseException:
        if not _signalled.is_set():
            raise
        interrupted = True
        raise KeyboardInterrupt from None
    finally:
        if in_main:  # a second Ctrl-C must not cut the cleaning up short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            sessions.stop(interrupted=interrupted)
        finally:
            py4j.setLevel(level)
            logging.getLogger().removeFilter(root_filter)
            if in_main:
                signal.signal(signal.SIGINT, sigint)
                signal.signal(signal.SIGTERM, previous)
