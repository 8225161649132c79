"""The Grafana dashboard (monitoring/grafana/factstream.json) is importable and queries only metrics that
a running host exports: every PromQL expression is parsed, and each metric name it reads is looked up in
the ``/metrics`` of a main and a worker replicating over TCP after a little traffic."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factstream.testing import HostCluster

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "monitoring" / "grafana" / "factstream.json"

ALICE = "@alice:hs"
TOKEN = "tok-alice"

#: PromQL words that are not metric names: operators, grouping and matching modifiers.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "atan2",
}  # fmt: skip
#: Keywords followed by a list of labels in parentheses (optional after ``group_left``/``group_right``).
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN_RE = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')"""
    r"|(?P<range>\[[^\]]*\])"
    r"|(?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![\w])"
    r"|(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
    r"|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"|(?P<variable>\$\{?\w+\}?)"
    r"|(?P<punct>==|!=|<=|>=|=~|!~|[-+*/%^(){},=<>@])"
    r"|(?P<space>\s+)"
)


def tokens(expr: str) -> list[tuple[str, str]]:
    """``(kind, text)`` of each token of a PromQL expression (whitespace dropped); fails on anything else."""
    found, pos = [], 0
    while pos < len(expr):
        match = TOKEN_RE.match(expr, pos)
        assert match is not None, f"cannot parse {expr!r} at {expr[pos:]!r}"
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append((kind, match.group()))
        pos = match.end()
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: the identifiers outside ``{...}`` that are not a
    function or aggregation (followed by ``(``, ``by`` or ``without``), a keyword, or a label of the list
    that follows ``by``, ``without``, ``on``, ``ignoring``, ``group_left`` or ``group_right``."""
    toks = tokens(expr)
    names: set[str] = set()
    braces = 0
    after_list_keyword = in_label_list = False
    for i, (kind, text) in enumerate(toks):
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if after_list_keyword:
            after_list_keyword = False
            in_label_list = text == "("
            if in_label_list:
                continue
        if text == "{":
            braces += 1
        elif text == "}":
            braces -= 1
        elif text == ")":
            in_label_list = False
        elif kind == "name" and text in KEYWORDS:
            after_list_keyword = text in LABEL_LIST_KEYWORDS
        elif kind == "name" and braces == 0 and not in_label_list and following not in {"(", "by", "without"}:
            names.add(text)
    assert braces == 0, f"unbalanced braces in {expr!r}"
    return names


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for item in items:
        yield item
        yield from panels(item.get("panels", []))


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    board = dashboard()
    exprs = [target["expr"] for panel in panels(board["panels"]) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert match, f"variable {variable['name']}: expected label_values(SELECTOR, LABEL), got {query!r}"
            exprs.append(match.group(1))
    return exprs


def test_the_parser_finds_metric_names_and_only_them() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{instance=~"$instance", x="by"}[5m])))'
        " / on (route) group_left b_total + time() - c offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_the_dashboard_is_importable() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "stream"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    ids = [panel["id"] for panel in panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    for title in ("Health", "Positions", "Replication links", "Lag", "Caches", "/sync", "HTTP", "Export"):
        assert any(title in row for row in rows), f"no row for {title}"
    for panel in panels(board["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            metric_names(target["expr"])  # parses


#: The series a family of each type is scraped as, besides its own name.
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}


def exported_names(exposition: str) -> set[str]:
    """The series names a scrape of this text can hold: every sample's name, and for each declared family
    the names of its type (a counter's ``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            names.add(family)
            suffixes = {
                "counter": ["_total"],
                "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["_sum", "_count"],
            }
            names.update(family + suffix for suffix in suffixes.get(kind, []))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.fixture
def bundled_plugins() -> None:
    from factstream.plugin.manager import load_plugins

    if "account_data" not in load_plugins().registry.streams.names():
        pytest.skip("the bundled account_data plugin is not installed (uv sync --all-packages)")


async def test_every_metric_the_dashboard_reads_is_exported_by_a_host(
    bundled_plugins: None, host_cluster: HostCluster
) -> None:
    host_cluster.configure(
        stream_writers={"account_data": ["main"]}, http={"tokens": {TOKEN: {"user": ALICE, "write": True}}}
    )
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "account_data")
    async with host_cluster.client(main, TOKEN) as client, host_cluster.client(worker, TOKEN) as on_worker:
        path = f"/user/{ALICE}/account_data/m.grafana"
        assert (await client.put(path, json={"n": 1})).status_code == 200
        assert (await client.get(path)).status_code == 200
        assert (await client.get(path)).status_code == 200
        assert (await client.get("/no/such/route")).status_code == 404
        first = (await on_worker.get("/sync", params={"timeout": "0"})).json()["next_batch"]
        assert (await on_worker.get("/sync", params={"since": first, "timeout": "50"})).status_code == 200
        exposition = (await client.get("/metrics")).text + (await on_worker.get("/metrics")).text

    exported = exported_names(exposition)
    assert "factstream_stream_persisted_upto" in exported  # the scrape is real
    wanted = {name for expr in expressions() for name in metric_names(expr)}
    assert all(name.startswith("factstream_") for name in wanted), sorted(wanted)
    missing = sorted(wanted - exported)
    assert missing == [], f"the dashboard reads metrics no host exports: {missing}"
