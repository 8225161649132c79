"""HTTP request metrics: every request counted by route template, method and status, with its duration;
the ``route`` label never takes a raw path; ``metrics.enabled: false`` counts nothing."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from factstream.host.request_metrics import UNMATCHED


def requests(route: str, method: str, status: int) -> float:
    labels = {"route": route, "method": method, "status": str(status), "instance": "main"}
    return REGISTRY.get_sample_value("factstream_http_requests_total", labels) or 0.0


def timed(route: str, method: str) -> float:
    labels = {"route": route, "method": method, "instance": "main"}
    return REGISTRY.get_sample_value("factstream_http_request_duration_seconds_count", labels) or 0.0


async def scraped_routes(client) -> set[str]:
    """The ``route`` labels of ``factstream_http_requests_total`` that ``/metrics`` shows."""
    text = (await client.get("/metrics")).text
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "factstream_http_requests"]
    return {sample.labels["route"] for sample in family.samples if sample.name.endswith("_total")}


async def test_a_200_a_400_and_a_404_are_counted_under_their_route_template(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    before = {
        "ok": requests("/streams/{name}/positions", "GET", 200),
        "missing": requests("/streams/{name}/positions", "GET", 404),
        "bad": requests("/sync", "GET", 400),
        "timed": timed("/streams/{name}/positions", "GET"),
    }

    assert (await alice.get("/streams/inbox/positions")).status_code == 200
    assert (await alice.get("/streams/nope/positions")).status_code == 404
    assert (await alice.get("/streams/other/positions")).status_code == 404
    assert (await alice.get("/sync", params={"since": "not-a-token"})).status_code == 400

    assert requests("/streams/{name}/positions", "GET", 200) == before["ok"] + 1
    assert requests("/streams/{name}/positions", "GET", 404) == before["missing"] + 2
    assert requests("/sync", "GET", 400) == before["bad"] + 1
    assert timed("/streams/{name}/positions", "GET") == before["timed"] + 3
    assert "/streams/{name}/positions" in await scraped_routes(client(host))


async def test_unmatched_paths_share_one_label_and_no_raw_path_becomes_a_label(inbox_cluster, client):
    host = await inbox_cluster()
    anonymous = client(host)
    before = requests(UNMATCHED, "GET", 404)

    for i in range(5):
        assert (await anonymous.get(f"/no/such/path/{i}")).status_code == 404
    assert (await anonymous.request("BREW", "/no/such/pot")).status_code == 404

    assert requests(UNMATCHED, "GET", 404) == before + 5
    assert requests(UNMATCHED, "OTHER", 404) >= 1
    routes = await scraped_routes(anonymous)
    assert UNMATCHED in routes
    assert not any(route.startswith("/no/") for route in routes), routes


async def test_a_wrong_method_on_a_known_route_is_counted_under_that_route(inbox_cluster, client):
    host = await inbox_cluster()
    before = requests("/inbox/messages", "GET", 405)

    assert (await client(host, "writer-token").get("/inbox/messages")).status_code == 405

    assert requests("/inbox/messages", "GET", 405) == before + 1


async def test_with_metrics_disabled_no_request_is_counted(inbox_cluster, client):
    host = await inbox_cluster(metrics={"enabled": False})
    alice = client(host, "alice-token")
    before = requests("/streams/{name}/positions", "GET", 200), timed("/streams/{name}/positions", "GET")

    for _ in range(3):
        assert (await alice.get("/streams/inbox/positions")).status_code == 200

    after = requests("/streams/{name}/positions", "GET", 200), timed("/streams/{name}/positions", "GET")
    assert after == before
