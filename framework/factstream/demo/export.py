"""The demo's export, run as ``python -m factstream.demo.export CONFIG OUTPUT`` (a process of its own,
so that the demo can stop it and its Spark JVM at once, as one process group).

It starts Spark at once, prints ``ready``, and waits for a line on stdin: the
demo starts it before its story, so that Spark's start-up overlaps the instances' and the story. It
then exports every registered stream as it is (one job ``demo_<stream>`` per stream: the facts, no
transform) with the export runner, into ``OUTPUT/<job>/``, and prints one JSON line per job:
``{"job", "stream", "rows", "upto", "seconds", "output"}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from factstream.plugin.specs import ExportJobSpec

#: A JVM that starts fast rather than one that runs long: the demo's export is a few dozen rows, and on a
#: 2-core machine the C1 compiler alone and the serial collector halve Spark's start-up and first jobs.
QUICK_START = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=2",
    "spark.sql.adaptive.enabled": "false",
}


def demo_jobs(streams: list[str]) -> list[ExportJobSpec]:
    return [ExportJobSpec(name=f"demo_{name}", stream=name) for name in streams]


def main(argv: list[str]) -> int:
    from factstream.cli import BUILTIN_COMMANDS
    from factstream.config import load_config
    from factstream.export.output import local_uri
    from factstream.export.runner import ExportRunner
    from factstream.export.session import build_session
    from factstream.plugin.manager import load_plugins

    config, output = Path(argv[0]), Path(argv[1])
    settings = load_config(config)
    assert settings.database.url, "the demo's configuration names its database"
    plugins = load_plugins()
    plugins.registry.finish_commands(BUILTIN_COMMANDS)
    output.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def note(what: str) -> None:  # into export.log
        print(f"[demo export {time.monotonic() - started:6.1f}s] {what}", file=sys.stderr, flush=True)

    spark = build_session("local[2]", app_name="factstream demo export", conf=QUICK_START)
    try:
        note("Spark session started")
        runner = ExportRunner(spark, plugins, settings.database.url, local_uri(output))
        note("ready")
        print("ready", flush=True)
        if not sys.stdin.readline():  # the demo closed stdin without asking: it is stopping
            return 0
        note("exporting")
        for job in demo_jobs([r.spec.name for r in plugins.registry.streams if not r.spec.kept]):
            r = runner.run(job, full=True)
            note(f"{job.name}: {r.rows} rows")
            line = {"job": r.job, "stream": r.stream, "rows": r.rows, "upto": r.upto, "seconds": r.seconds}
            print(json.dumps(line | {"output": str(output / r.job)}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
