"""How the suite's Spark JVMs start: quick flags, and a class-data archive of Spark's classes when one is ready.

Every Spark JVM the tests start through PySpark (the suite's own session, each ``factstream export``,
the processes of a generated plugin's tests, a standalone cluster's executors) takes its options from
``PYSPARK_SUBMIT_ARGS``, which ``tests/conftest.py`` sets from :func:`submit_args`:

* the C1 compiler alone and the serial collector (:data:`QUICK_JVM`): the tests' JVMs run seconds on a
  few hundred rows, and start in about half the CPU so (``factstream export`` itself keeps the JVM's
  defaults: a real export runs long enough for C2 to pay);
* where :func:`build` has made one on this machine, a dynamic class-data sharing archive of the classes
  a Spark job loads (``-XX:SharedArchiveFile``): the JVM maps them instead of parsing and verifying
  some 10,000 classes from Spark's jars, which halves the CPU of a start (15 s -> 8 s of a session that
  writes and reads a Parquet file, on the 2-core machine). The archive is made once per machine, JDK and
  Spark (its name is a hash of the three and of the flags: :func:`archive_path`), under the user's cache
  directory; ``./dev test`` makes it before the suite when it is missing (``python -m tests.class_archive``,
  about 30 s). A JVM that cannot use it (another classpath: a standalone cluster's master and worker)
  starts without it, silently (``-Xlog:cds=off``).

The options are not in a ``SPARK_CONF_DIR``: Spark puts that directory on the JVM's classpath, and
class-data sharing refuses a classpath with a non-empty directory on it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

#: The flags of every test JVM: C1 alone, the serial collector, two compiler threads.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=2"
#: What a JVM that cannot map the archive would print, every time; it starts without it.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: The job whose classes the archive holds: what an export test does (a DataFrame written to Parquet
#: and read back), on a local session as the suite's.
_JOB = """
import sys
from pyspark.sql import SparkSession
session = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
frame = session.createDataFrame([(i, str(i)) for i in range(200)], ["a", "b"])
frame.repartition(2).write.mode("overwrite").parquet(sys.argv[1])
assert session.read.parquet(sys.argv[1]).groupBy("b").count().count() == 200
session.stop()
"""


def _java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60, check=False)
    return done.stderr + done.stdout


def archive_path() -> Path | None:
    """Where the archive of this machine's JDK and Spark is (or would be); ``None`` without Java or PySpark."""
    spec = importlib.util.find_spec("pyspark")  # not imported: this runs in every pytest process
    if spec is None or spec.origin is None:
        return None
    try:
        java = _java_version()
    except (OSError, subprocess.SubprocessError):
        return None
    jars = sorted(p.name for p in (Path(spec.origin).parent / "jars").glob("*.jar"))
    key = hashlib.sha256("\n".join([java, version("pyspark"), QUICK_JVM, *jars]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "factstream" / "spark-cds" / f"spark-{key}.jsa"


def java_options(archive: Path | None) -> str:
    """A test JVM's options: the quick flags, and the archive if it exists."""
    if archive is not None and archive.is_file():
        return f"{QUICK_JVM} -XX:SharedArchiveFile={archive} {QUIET_CDS}"
    return QUICK_JVM


def submit_args(archive: Path | None) -> str:
    """``PYSPARK_SUBMIT_ARGS``: :func:`java_options` for the driver and the executors."""
    options = java_options(archive)
    confs = [f"spark.{side}.extraJavaOptions={options}" for side in ("driver", "executor")]
    return " ".join(f"--conf {shlex.quote(conf)}" for conf in confs) + " pyspark-shell"


def build(archive: Path) -> bool:
    """Make the archive if it is missing (one maker at a time, the others wait); whether it exists now."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file():
            return True
        for old in archive.parent.glob("spark-*.jsa"):  # another JDK's or Spark's
            old.unlink()
        with tempfile.TemporaryDirectory(prefix="spark-cds-") as work:
            made = Path(work) / "archive.jsa"
            options = f"{QUICK_JVM} -XX:ArchiveClassesAtExit={made}"
            env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
            env["PYSPARK_SUBMIT_ARGS"] = (
                f"--conf {shlex.quote(f'spark.driver.extraJavaOptions={options}')} pyspark-shell"
            )
            done = subprocess.run(
                [sys.executable, "-c", _JOB, str(Path(work) / "out")],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0 or not made.is_file():
                print(f"could not make the archive (exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
                return False
            os.replace(made, archive)
    return True


def main() -> int:
    archive = archive_path()
    if archive is None:
        print("no Java or no PySpark here: the tests' Spark JVMs start without a class-data archive")
        return 0
    if archive.is_file():
        return 0
    print(f"making a class-data archive of Spark's classes for the tests' JVMs, once per machine: {archive}")
    return 0 if build(archive) else 1


if __name__ == "__main__":
    sys.exit(main())
