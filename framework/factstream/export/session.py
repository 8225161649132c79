"""Starting the Spark session an export runs in: local by default, any cluster with a master URL.

Executors run the factstream data source in Python workers, so they need an interpreter with
factstream installed: ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``). When neither is set it defaults
to the running interpreter, which is right for ``local[*]`` and for clusters whose nodes share this
environment's path (the same image or virtualenv everywhere); otherwise set it to the executors' one.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from factstream.export.plan import ExportError

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"

#: Settings every export session gets unless the caller overrides them.
BASE_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
    # Writes go to a staging directory that the runner commits itself (see factstream.export.output).
    "spark.sql.parquet.compression.codec": "snappy",
}

#: Extra settings for a local master: no web UI, few shuffle partitions (exports do not shuffle much).
LOCAL_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def check_master(master: str, timeout: float = 5.0) -> None:
    """Fail fast, with one paragraph, when a ``spark://`` or ``k8s://`` master cannot be reached.

    Spark itself retries an unreachable standalone master for a minute before giving up.
    """
    if master.startswith("local") or master == "yarn":
        return
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        endpoints = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]) if ":" in h else 7077) for h in hosts]
    elif master.startswith("k8s://"):
        parsed = urlsplit(master[len("k8s://") :])
        if not parsed.hostname:
            raise ExportError(f"Spark master {master!r} is not a valid k8s://https://HOST:PORT URL")
        endpoints = [(parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80))]
    else:
        raise ExportError(
            f"unsupported Spark master {master!r}: use local[N], local[*], spark://HOST:PORT, k8s://https://HOST:PORT "
            "or yarn"
        )
    problems = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            problems.append(f"{host}:{port} ({exc})")
    raise ExportError(
        f"cannot reach the Spark master {master!r}: {'; '.join(problems)}. Check --master, that the cluster is "
        "running and that this machine can connect to it; nothing was exported and no checkpoint moved."
    )


def build_session(
    master: str = DEFAULT_MASTER, *, app_name: str = "factstream export", conf: Mapping[str, str] | None = None
) -> Any:
    """A Spark session for exports (``pyspark.sql.SparkSession``); raises :class:`ExportError` on failure."""
    check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**BASE_CONF, **(LOCAL_CONF if master.startswith("local") else {}), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    started = time.monotonic()
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        reason = " ".join(str(exc).split())[:500]
        raise ExportError(
            f"cannot start Spark with master {master!r}: {type(exc).__name__}: {reason}. Check --master and that "
            "Java 17 or later is installed (JAVA_HOME); nothing was exported and no checkpoint moved."
        ) from None
    log.info("Spark session (%s) started in %.1f s", master, time.monotonic() - started)
    return spark
