"""The demo's wall time: ``uv run python benchmarks/demo_run.py [--runs N] [--no-export]``.

Runs ``factstream demo`` N times, one after the other, in a temporary directory with nothing
configured (no ``FACTSTREAM_*`` variables, the embedded PostgreSQL under ``<tmp>/.factstream``), as a
user's first and later runs. The first run also initialises the embedded server. Prints, per run, the
wall time, the time until both instances had started and the time the Spark export took (the demo's
own timestamps), then the median of the later runs. Not part of ``run.py``: it needs no scratch
database and measures the whole command, Python's and Spark's start-ups included.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(workdir: Path, export: bool) -> tuple[float, float | None, float | None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTSTREAM_")}
    args = [sys.executable, "-m", "factstream", "demo", *([] if export else ["--no-export"])]
    started = time.monotonic()
    result = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"the demo failed with status {result.returncode}:\n{result.stdout}\n{result.stderr}")
    up = re.search(r"\[\s*([\d.]+)s\] instances started", result.stdout)
    spark = re.search(r"Spark export done in ([\d.]+) s", result.stdout)
    return wall, float(up.group(1)) if up else None, float(spark.group(1)) if spark else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs in one state directory (default 3)")
    parser.add_argument("--no-export", action="store_true", help="run the demo without its Spark export")
    args = parser.parse_args()
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(
        f"factstream demo{' --no-export' if args.no_export else ''}: {args.runs} runs, {cores} cores, load {load:.1f}"
    )
    walls = []
    with tempfile.TemporaryDirectory(prefix="factstream-demo-bench-") as tmp:
        for n in range(1, args.runs + 1):
            wall, up, spark = one_run(Path(tmp), not args.no_export)
            walls.append(wall)
            parts = [f"run {n}: {wall:6.1f} s wall", f"instances up at {up:.1f} s" if up is not None else ""]
            parts += [f"Spark export {spark:.1f} s after the story" if spark is not None else ""]
            print(", ".join(p for p in parts if p) + (" (first: initialises the embedded server)" if n == 1 else ""))
    later = walls[1:] or walls
    print(f"median of the later runs: {statistics.median(later):.1f} s")


if __name__ == "__main__":
    main()
