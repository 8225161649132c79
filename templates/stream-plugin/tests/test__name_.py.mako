"""The ${name} plugin for real: its entry point, its migrations, and hosts replicating its stream.

PostgreSQL: ``FACTSTREAM_TEST_DATABASE_URL`` when set (the tests create and drop their own databases
there), else an embedded server started for the run.
"""

import subprocess
import sys
from pathlib import Path

import factstream
import pytest
from factstream.testing import HostCluster, connect

STREAM = "${name}"
#: The instances that write the stream (``stream_writers`` in the configuration).
WRITERS = ${writers_py}
#: An instance that only reads the stream, over replication.
READER = "${reader}"
#: Every instance of the tests' deployment: main, the writers, the reader.
INSTANCES = ${instances_py}
TOKENS = {
    "service-token": {"user": "@service:example.org", "write": True},
    "alice-token": {"user": "@alice:example.org", "write": False},
    "bob-token": {"user": "@bob:example.org", "write": False},
}


def factstream_command(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``factstream ARGS`` as a user would, in a directory of its own."""
    env = {**env, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "factstream", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def table_exists(url: str, name: str) -> bool:
    with connect(url) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,)


@pytest.fixture
async def cluster(host_cluster: HostCluster) -> HostCluster:
    """Every instance (main first: TCP replication goes through it), each following the stream."""
    host_cluster.configure(instances=INSTANCES, stream_writers={STREAM: WRITERS}, http={"tokens": TOKENS})
    for name in INSTANCES:
        await host_cluster(name)
    for name in INSTANCES:
        if WRITERS != [name]:  # a sole writer follows nobody
            await host_cluster.following(name, STREAM)
    return host_cluster


def test_factstream_finds_the_plugin_through_its_entry_point(plugin_env: dict[str, str], tmp_path: Path) -> None:
    listed = factstream_command("plugins", env=plugin_env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next((line for line in listed.stdout.splitlines() if " ${package} " in line), "")
    assert row.split("│")[1].strip() == STREAM, listed.stdout  # the plugin's name
    assert row.split("│")[4].strip() == STREAM, listed.stdout  # the stream it registers


def test_the_migrations_go_up_and_down(plugin_env: dict[str, str], fresh_database: str, tmp_path: Path) -> None:
    env = {**plugin_env, "FACTSTREAM_DATABASE__URL": fresh_database}
    for step in (["migrate"], ["migrate", "down", "--plugin", STREAM, "--yes"], ["migrate"]):
        done = factstream_command(*step, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert table_exists(fresh_database, STREAM) == (step == ["migrate"]), " ".join(step)


async def test_an_append_reaches_every_host_and_invalidates_its_cache(cluster: HostCluster) -> None:
    hosts = [cluster[name] for name in INSTANCES]
    readers = [cluster.client(host, "bob-token") for host in hosts]
    # Every host reads, and caches, a count of 0.
    for client in readers:
        assert (await client.get(f"/{STREAM}/k1")).json() == {"key": "k1", "count": 0}

    positions = {}
    for n, writer in enumerate(WRITERS, start=1):
        fact = {"user_id": "@alice:example.org", "key": "k1", "value": f"from {writer}"}
        response = await cluster.client(writer, "service-token").post(f"/{STREAM}", json=fact)
        assert response.status_code == 200, response.text
        assert response.json()["instance"] == writer
        positions[writer] = response.json()["stream_id"]
        # The writer forgot its entry when the transaction committed: it reads its own write at once.
        assert (await cluster.client(writer, "bob-token").get(f"/{STREAM}/k1")).json()["count"] == n

    # Every other host forgets its entry before its position passes the fact: wait, then read.
    for host, client in zip(hosts, readers, strict=True):
        for writer, stream_id in positions.items():
            assert await host.api.wait_for_stream_position(writer, STREAM, stream_id, timeout=10)
        assert (await client.get(f"/{STREAM}/k1")).json() == {"key": "k1", "count": len(WRITERS)}
% if sync:


async def test_sync_shows_a_fact_to_its_user_only(cluster: HostCluster) -> None:
    writer, reader = WRITERS[0], cluster[READER]
    fact = {"user_id": "@alice:example.org", "key": "k1", "value": "v1"}
    response = await cluster.client(writer, "service-token").post(f"/{STREAM}", json=fact)
    stream_id = response.json()["stream_id"]
    assert await reader.api.wait_for_stream_position(writer, STREAM, stream_id, timeout=10)

    synced = (await cluster.client(reader, "alice-token").get("/sync")).json()
    assert synced["streams"][STREAM] == [{"stream_id": stream_id, "instance": writer, **fact}]
    assert STREAM not in (await cluster.client(reader, "bob-token").get("/sync")).json()["streams"]
% endif


async def test_a_write_sent_to_a_reader_is_misdirected(cluster: HostCluster) -> None:
    fact = {"user_id": "@alice:example.org", "key": "k1", "value": "v1"}
    response = await cluster.client(READER, "service-token").post(f"/{STREAM}", json=fact)
    assert response.status_code == 421
    assert response.json()["errcode"] == "M_MISDIRECTED"


@pytest.mark.parametrize(
    ("body", "status", "errcode"),
    [
        (b"not json", 400, "M_NOT_JSON"),
        (b'{"user_id": "@alice:example.org", "key": "k1"}', 400, "M_BAD_JSON"),
        (b'{"user_id": "@alice:example.org", "key": "", "value": "v"}', 400, "M_INVALID_PARAM"),
        (b'{"user_id": "@alice:example.org", "key": "k1", "value": "a\\u0000b"}', 400, "M_BAD_JSON"),  # NUL
        (b'{"user_id": "@alice:example.org", "key": "k1", "value": "' + b"x" * 70_000 + b'"}', 413, "M_TOO_LARGE"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    cluster: HostCluster, body: bytes, status: int, errcode: str
) -> None:
    writer = WRITERS[0]
    response = await cluster.client(writer, "service-token").post(f"/{STREAM}", content=body)
    assert response.status_code == status, response.text
    assert response.json()["errcode"] == errcode
    assert (await cluster.client(writer, "bob-token").get(f"/{STREAM}/k1")).json()["count"] == 0


async def test_the_settings_limit_values(host_cluster: HostCluster) -> None:
    # plugins={"${name}": {"max_value_length": 3}} would do the same, as in the configuration file.
    environ = {"FACTSTREAM_PLUGINS__${name.upper()}__MAX_VALUE_LENGTH": "3"}
    host_cluster.configure(instances=INSTANCES, stream_writers={STREAM: WRITERS}, http={"tokens": TOKENS})
    writer = await host_cluster(WRITERS[0], environ=environ)
    fact = {"user_id": "@alice:example.org", "key": "k1", "value": "four"}
    response = await host_cluster.client(writer, "service-token").post(f"/{STREAM}", json=fact)
    assert response.status_code == 400
    assert response.json() == {"errcode": "M_INVALID_PARAM", "error": "value must be at most 3 characters long"}


async def test_a_bad_setting_stops_start_up(host_cluster: HostCluster) -> None:
    with pytest.raises(factstream.ConfigError) as stopped:
        await host_cluster(plugins={STREAM: {"max_value_length": 0}})
    assert str(stopped.value).startswith(f"invalid settings of plugin '{STREAM}': plugins.{STREAM}.max_value_length")
