"""The ``${name}_all`` export job, run by ``factstream export`` on a local Spark, writes every fact once."""

from pathlib import Path

import pyarrow.parquet as pq
from factstream.testing import HostCluster
from test_${name} import STREAM, WRITERS, factstream_command


async def test_the_export_job_writes_exactly_the_appended_facts(
    host_cluster: HostCluster, plugin_env: dict[str, str], tmp_path: Path
) -> None:
    from ${package}.rows import ${camel}Row  # imported here: the fixtures install the plugin
    from ${package}.store import ${camel}Store

    host_cluster.configure(stream_writers={STREAM: WRITERS})
    appended = set()
    for writer in WRITERS:
        host = await host_cluster(writer)
        for n in range(3):
            row = ${camel}Row(user_id=f"@user{n}:example.org", key=f"k{n % 2}", value=f"{writer} {n}")
            stream_id = await host.api.state(${camel}Store).append(row)
            appended.add((stream_id, writer, row.user_id, row.key, row.value))
    await host_cluster.close()  # the writers are gone: the export's watermark is the last fact

    env = {**plugin_env, "FACTSTREAM_DATABASE__URL": host_cluster.database_url}
    out = tmp_path / "exports"
    out.mkdir()
    job = ["export", "${name}_all", "--master", "local[1]", "--output", str(out)]
    done = factstream_command(*job, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout

    table = pq.read_table(out / "${name}_all").to_pylist()
    exported = {(r["stream_id"], r["instance_name"], r["user_id"], r["key"], r["value"]) for r in table}
    assert len(table) == len(appended)
    assert exported == appended
