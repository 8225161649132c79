"""The dashboard without a browser: what ``/dashboard/state`` holds on a running pair, who may see the
dashboard (loopback or ``dashboard.token``, never when disabled), that bad input is never a 500, and
the recent-problems handler behind it. The page in a real browser: test_dashboard_browser.py."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from types import SimpleNamespace

import httpx
import pytest

from factstream.config import load_config
from factstream.host.app import Host
from factstream.host.dashboard import STATIC_DIR, instances_state, is_loopback
from factstream.host.recent import KEEP, MAX_MESSAGE, RecentProblems
from factstream.testing import free_port, until
from tests.host.conftest import post_messages

DASHBOARD_TOKEN = "dash-s3cret"


def peer(host: Host, address: str = "127.0.0.1", headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """A client of ``host``'s ASGI app that connects from ``address``."""
    transport = httpx.ASGITransport(app=host.app, client=(address, 50123))
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers or {})


async def state_of(host: Host) -> dict:
    async with peer(host) as http:
        response = await http.get("/dashboard/state")
    assert response.status_code == 200, response.text
    return response.json()


# -- the state ---------------------------------------------------------------------------------------------


async def test_the_state_shows_instances_streams_links_and_lag_of_a_running_pair(inbox_cluster, client):
    ports = {"main": free_port(), "worker1": free_port()}
    inbox_cluster.configure(
        instances=("main", "worker1"), instance_map={name: {"http_port": port} for name, port in ports.items()}
    )
    main = await inbox_cluster("main")
    worker = await inbox_cluster("worker1")
    await inbox_cluster.following(worker, "inbox")
    ids = await post_messages(main, client, ("@alice:hs", "one"), ("@bob:hs", "two"))
    await until(lambda: worker.id_generator("inbox").get_current_token() >= ids[-1], what="worker to apply")

    state = await state_of(worker)

    assert state["instance"] == "worker1"
    assert state["deployment"] == "test"
    assert state["instances"] == [
        {
            "name": "main",
            "main": True,
            "self": False,
            "url": f"http://127.0.0.1:{ports['main']}",
            "dashboard_url": f"http://127.0.0.1:{ports['main']}/dashboard",
            "replication_port": inbox_cluster.main_port,
        },
        {
            "name": "worker1",
            "main": False,
            "self": True,
            "url": f"http://127.0.0.1:{ports['worker1']}",
            "dashboard_url": f"http://127.0.0.1:{ports['worker1']}/dashboard",
            "replication_port": None,
        },
    ]
    inbox = next(s for s in state["streams"] if s["name"] == "inbox")
    assert inbox["writers"] == ["main"]
    assert inbox["is_writer"] is False
    assert inbox["positions"]["main"] == ids[-1]
    assert inbox["current"] == inbox["min"] == inbox["persisted_upto"] == ids[-1]
    [link] = state["links"]
    assert link["peer"] == "main"
    assert (link["transport"], link["direction"], link["state"], link["up"]) == ("tcp", "outbound", "up", True)
    assert link["connects"] == 1 and link["down_for"] == 0
    # the counters are the transport's (factstream.replication.links); the state carries every one
    counters = ("commands_sent", "commands_received", "rows_sent", "rows_received", "bytes_sent", "bytes_received")
    assert all(isinstance(link[c], int) for c in counters)
    assert link["rows_received"] >= 2 and link["bytes_received"] > 0
    lag = next(lag for lag in state["lags"] if lag["stream"] == "inbox" and lag["writer"] == "main")
    assert lag["applied_position"] == ids[-1]
    assert lag["lag_positions"] == 0 and lag["lag_seconds"] == 0
    assert {"time", "caches", "long_polls", "problems"} <= set(state)

    main_state = await state_of(main)
    assert [link["peer"] for link in main_state["links"]] == ["worker1"]
    assert main_state["links"][0]["direction"] == "inbound"
    assert next(s for s in main_state["streams"] if s["name"] == "inbox")["is_writer"] is True


async def test_over_redis_the_state_shows_the_one_redis_link(inbox_cluster, redis_url):
    inbox_cluster.configure(transport="redis")
    main = await inbox_cluster("main")

    async def linked() -> list:
        return [link for link in (await state_of(main))["links"] if link["up"]]

    [link] = await until(linked, what="the Redis link to come up")
    assert (link["transport"], link["direction"], link["state"]) == ("redis", "outbound", "up")
    assert link["peer"].startswith("redis://")


def test_a_single_instance_without_instance_map_lists_itself():
    settings = load_config(environ={}, instance_name="solo", http={"port": 8123})
    host = SimpleNamespace(instance_name="solo", settings=settings)
    assert instances_state(host) == [
        {
            "name": "solo",
            "main": True,
            "self": True,
            "url": "http://127.0.0.1:8123",
            "dashboard_url": "http://127.0.0.1:8123/dashboard",
            "replication_port": None,
        }
    ]


async def test_the_state_counts_open_long_polls(inbox_cluster, client):
    main = await inbox_cluster("main")
    alice = client(main, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    assert (await state_of(main))["long_polls"] == {"open": 0}

    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 20000}))

    async def one_open() -> bool:
        return (await state_of(main))["long_polls"]["open"] == 1

    await until(one_open, what="the long poll to show")
    await post_messages(main, client, ("@alice:hs", "wake up"))
    assert (await asyncio.wait_for(poll, 5)).status_code == 200
    assert (await state_of(main))["long_polls"] == {"open": 0}


async def test_the_state_shows_cache_hit_rates(inbox_cluster):
    main = await inbox_cluster("main")
    state = await state_of(main)
    for cache in state["caches"]:
        lookups = cache["hits"] + cache["misses"]
        assert cache["hit_rate"] == (None if lookups == 0 else round(cache["hits"] / lookups, 4))
        assert set(cache) == {"name", "size", "max_size", "hits", "misses", "evictions", "invalidations", "hit_rate"}


async def test_the_state_shows_recent_warnings_and_errors_newest_first_while_the_host_runs(inbox_cluster):
    main = await inbox_cluster("main")
    log = logging.getLogger("factstream.tests.dashboard")
    log.info("not a problem")
    log.warning("disk %s is filling up", "/var")
    try:
        raise ValueError("bad thing")
    except ValueError:
        log.exception("a job failed")

    problems = (await state_of(main))["problems"]

    ours = [p for p in problems if p["logger"] == "factstream.tests.dashboard"]
    assert [(p["level"], p["message"]) for p in ours] == [
        ("ERROR", "a job failed: ValueError: bad thing"),
        ("WARNING", "disk /var is filling up"),
    ]
    await main.stop()
    log.warning("after the stop")
    assert all(p.message != "after the stop" for p in main.recent.problems())


# -- access ------------------------------------------------------------------------------------------------

LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
#: A reverse proxy on the same machine: a loopback peer relaying a remote client, which counts as remote.
PROXIED = {
    "Forwarded": "for=203.0.113.7",
    "X-Forwarded-For": "203.0.113.7",
    "X-Real-IP": "203.0.113.7",
}
REMOTE = ("10.1.2.3", "2001:db8::1")
SENT = {
    "none": {},
    "right bearer": {"headers": {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}},
    "right query": {"params": {"token": DASHBOARD_TOKEN}},
    "wrong bearer": {"headers": {"Authorization": "Bearer nope"}},
    "wrong query": {"params": {"token": "nope"}},
    "an API token": {"headers": {"Authorization": "Bearer alice-token"}},
}
GUARDED = ("/dashboard", "/dashboard/state")


def expected_status(*, enabled: bool, configured: bool, loopback: bool, sent: str) -> int:
    """The rule of docs/dashboard.md, "Access"."""
    if not enabled:
        return 404
    if loopback:
        return 200
    if not configured:
        return 403
    return 200 if sent.startswith("right") else 401


@pytest.mark.parametrize(
    ("enabled", "configured"), [(True, False), (True, True), (False, False), (False, True)], ids=str
)
async def test_access_loopback_or_token_and_never_when_disabled(inbox_cluster, enabled, configured):
    dashboard = {"enabled": enabled} | ({"token": DASHBOARD_TOKEN} if configured else {})
    host = await inbox_cluster("main", dashboard=dashboard)
    seen = []
    for address, sent, path in itertools.product(LOOPBACK + REMOTE, SENT, GUARDED):
        want = expected_status(enabled=enabled, configured=configured, loopback=address in LOOPBACK, sent=sent)
        async with peer(host, address) as http:
            response = await http.get(path, **SENT[sent])
        seen.append((address, sent, path, response.status_code))
        assert response.status_code == want, (address, sent, path, response.text)
        if want != 200:
            assert response.json()["errcode"] in {"M_NOT_FOUND", "M_FORBIDDEN", "M_MISSING_TOKEN", "M_UNKNOWN_TOKEN"}
        if want == 401:
            assert response.headers["www-authenticate"] == "Bearer"
    for (header, value), sent, path in itertools.product(PROXIED.items(), SENT, GUARDED):
        want = expected_status(enabled=enabled, configured=configured, loopback=False, sent=sent)
        options = dict(SENT[sent])
        options["headers"] = {**options.get("headers", {}), header: value}
        async with peer(host, "127.0.0.1") as http:
            response = await http.get(path, **options)
        seen.append(("127.0.0.1 via proxy", sent, path, response.status_code))
        assert response.status_code == want, (header, sent, path, response.text)
    assert len(seen) == (len(LOOPBACK + REMOTE) + len(PROXIED)) * len(SENT) * len(GUARDED)


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
async def test_the_root_redirects_to_the_dashboard_keeping_the_query(inbox_cluster, enabled):
    host = await inbox_cluster("main", dashboard={"enabled": enabled})
    async with peer(host, "10.1.2.3") as http:
        response = await http.get("/", params={"token": "x"})
    if enabled:
        assert response.status_code == 307
        assert response.headers["location"] == "/dashboard?token=x"
    else:
        assert response.status_code == 404


async def test_the_page_and_its_files_are_served_from_the_package_with_no_external_reference(inbox_cluster):
    host = await inbox_cluster("main", dashboard={"token": DASHBOARD_TOKEN})
    async with peer(host) as http:
        page = await http.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for path, media in (("/dashboard/dashboard.js", "text/javascript"), ("/dashboard/dashboard.css", "text/css")):
        assert f'"{path}"' in page.text
        async with peer(host, "10.1.2.3") as http:  # no data in them: anyone gets them while enabled
            asset = await http.get(path)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(media)
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        text = (STATIC_DIR / name).read_text().replace("http://www.w3.org/2000/svg", "")  # a namespace, not a fetch
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
        assert "@import" not in text and "url(" not in text, name


async def test_unknown_query_parameters_and_odd_input_are_never_a_500(inbox_cluster):
    host = await inbox_cluster("main", dashboard={"token": DASHBOARD_TOKEN})
    queries = [
        {"foo": "bar"},
        {"token": ""},
        {"token": "x" * 5000},
        {"token": ["a", "b"]},
        {"token": "é ☃"},
        {"since": "-1", "timeout": "abc", "format": "xml"},
    ]
    for address in ("127.0.0.1", "10.1.2.3"):
        for path in ("/", "/dashboard", "/dashboard/state", "/dashboard/dashboard.js"):
            for query in queries:
                async with peer(host, address, {"Authorization": "Basic Zm9vOmJhcg=="}) as http:
                    response = await http.get(path, params=query)
                assert response.status_code < 500, (address, path, query, response.text)
                if address == "127.0.0.1":
                    assert response.status_code in {200, 307}, (path, query, response.text)
    async with peer(host) as http:
        assert (await http.post("/dashboard/state")).status_code == 405
        assert (await http.get("/dashboard/nope")).status_code == 404


async def test_the_openapi_schema_lists_the_dashboard_routes(inbox_cluster):
    host = await inbox_cluster("main")
    async with peer(host) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    assert {"/", "/dashboard", "/dashboard/state"} <= set(paths)
    assert set(paths["/dashboard/state"]["get"]["responses"]) >= {"200", "401", "403", "404"}


def test_loopback_addresses():
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(a) for a in ("10.0.0.1", "::ffff:10.0.0.1", "2001:db8::1", "testclient", "", None))


# -- the recent problems handler ---------------------------------------------------------------------------


def test_recent_problems_keep_the_newest_warnings_and_errors_only():
    recent = RecentProblems()
    logger = logging.getLogger("factstream.tests.recent")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the badly formatted call below would print a traceback from other handlers
    recent.install(logger)
    recent.install(logger)  # idempotent: one handler
    try:
        logger.debug("quiet")
        logger.info("quiet too")
        for i in range(KEEP + 5):
            logger.warning("warning %d", i)
        logger.error("%s %s", "too few")  # a bad call still leaves a line
        logger.critical("x" * (MAX_MESSAGE + 10))
    finally:
        recent.remove()
    logger.error("not kept")
    problems = recent.problems()
    assert len(problems) == KEEP
    assert problems[0].message == "warning 7"
    assert problems[-2].level == "ERROR" and "could not format" in problems[-2].message
    assert problems[-1].level == "CRITICAL" and len(problems[-1].message) == MAX_MESSAGE
    assert problems[-1].message.endswith("…")
    assert logger.handlers.count(recent) == 0
