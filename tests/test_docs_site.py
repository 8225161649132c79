"""The documentation site (mkdocs.yml): it builds with ``--strict``, every page is in its navigation, the
CLI reference has every command the typer app registers and the API reference every public name."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from mkdocs.config import load_config

import factstream
import factstream.testing
from factstream.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: Folders of docs/ that hold no pages: a plugin project's sources, the build's hooks.
NOT_PAGES = ("examples/", "gen/")


#: Set by .ci/run to the site it has just built from this tree (``mkdocs build --strict``): read, not built again.
BUILT_SITE_ENV = "FACTSTREAM_DOCS_SITE"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it (``mkdocs build --strict``) into a temporary directory, or the one
    .ci/run built a moment ago (``FACTSTREAM_DOCS_SITE``)."""
    built = os.environ.get(BUILT_SITE_ENV)
    if built:
        assert (Path(built) / "index.html").is_file(), f"{BUILT_SITE_ENV}={built} holds no built site"
        return Path(built)
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # as ./dev docs and .ci/run build it
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def test_the_built_site_browses_from_disk(site: Path) -> None:
    """Every link of every built page, opened from disk (file://), reaches a file: no link names a
    directory (a browser would show its listing), none names a file the build did not write."""
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # a server's page: absolute links
    assert len(pages) > 20
    broken: list[str] = []
    for page in pages:
        for href in re.findall(r'<a\b[^>]*?\bhref="([^"]*)"', page.read_text(errors="replace")):
            target = html.unescape(href).split("#", 1)[0].split("?", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:|^//", target):
                continue  # a link within the page, or to another site
            resolved = (page.parent / target).resolve()
            if target.endswith("/") or not resolved.is_file():
                broken.append(f"{page.relative_to(site)}: {href}")
    assert broken == [], f"{len(broken)} links do not open a file from disk, e.g. {broken[:10]}"


def test_every_list_of_the_pages_renders_as_a_list(site: Path) -> None:
    """A Markdown list renders as one only where Python-Markdown sees it (a blank line before it, nested
    lists and an item's later paragraphs indented four spaces); GitHub is laxer, so a page can look right
    there and show "- item" inside a paragraph on the site. No paragraph of the built site starts a line
    with a list marker."""
    flat: list[str] = []
    for page in sorted(site.rglob("*.html")):
        text = re.sub(r"<(pre|script)\b.*?</\1>", "", page.read_text(errors="replace"), flags=re.S)
        for paragraph in re.findall(r"<p\b[^>]*>(.*?)</p>", text, flags=re.S):
            for hit in re.finditer(r"(?:^|\n)\s*((?:[-*+]|\d+\.) \S.{0,60})", paragraph):
                flat.append(f"{page.relative_to(site)}: {html.unescape(re.sub('<[^>]+>', '', hit.group(1)))}")
    assert flat == [], f"{len(flat)} list items render as text in a paragraph, e.g. {flat[:8]}"


def test_the_ways_the_project_builds_the_site_drop_the_third_party_banner() -> None:
    """mkdocs-material prints an end-of-life banner about itself unless NO_MKDOCS_2_WARNING is set:
    everywhere the project builds or serves the site sets it."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if "uv run mkdocs" in line and "NO_MKDOCS_2_WARNING=1" not in line] == []
    dev = (ROOT / "dev").read_text()
    docs = dev[dev.index("dev_docs() {") :].split("\n}\n", 1)[0]
    assert "export NO_MKDOCS_2_WARNING=1" in docs
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = path.read_text()
        assert "uv run mkdocs" not in text or "NO_MKDOCS_2_WARNING" in text, f"{path}: builds the site without it"


def ci_mkdocs_arguments() -> list[str]:
    """The arguments .ci/run gives ``mkdocs`` (``build --strict``)."""
    line = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "uv run mkdocs build" in line)
    return line.split("uv run mkdocs", 1)[1].split()


def test_the_ci_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """CI's mkdocs command fails a site with a broken link (mkdocs' ``-q`` would hide the warning that
    ``--strict`` fails on, and let it pass)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: broken\nnav:\n  - index.md\n")
    assert ci_mkdocs_arguments()[:2] == ["build", "--strict"]
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", *ci_mkdocs_arguments()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, f"a broken link passed CI's mkdocs build:\n{result.stderr}"
    assert "missing.md" in result.stderr


def nav_pages(entries: Any) -> list[str]:
    """Every file the mkdocs.yml ``nav`` names, depth first."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def test_every_page_of_docs_is_in_the_navigation(site: Path) -> None:
    config = load_config(str(ROOT / "mkdocs.yml"))
    in_nav = nav_pages(config["nav"])
    pages = sorted(
        str(path.relative_to(DOCS))
        for path in DOCS.rglob("*.md")
        if not str(path.relative_to(DOCS)).startswith(NOT_PAGES)
    )
    assert [page for page in pages if page not in in_nav] == [], "pages missing from mkdocs.yml's nav"
    assert len(in_nav) == len(set(in_nav)), "a page is in the nav twice"
    for page in pages:
        built = site / (page.removesuffix(".md") + ".html")
        assert built.is_file(), f"{page} was not built"


def registered_commands(command: Any, path: str = "factstream") -> dict[str, list[str]]:
    """Each command's full name and the flags of its visible options, from the typer app's click group."""
    ctx = command.context_class(command, info_name=path)
    flags = [
        flag
        for param in command.get_params(ctx)
        if param.param_type_name == "option" and not param.hidden
        for flag in param.opts
    ]
    found = {path: flags}
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            found |= registered_commands(sub, f"{path} {name}")
    return found


def sections(page: str) -> dict[str, str]:
    """A built page's text under each heading, keyed by the heading's id."""
    parts = re.split(r'<h[1-6] id="([^"]+)"', page)
    return {parts[i]: html.unescape(re.sub(r"<[^>]+>", "", parts[i + 1])) for i in range(1, len(parts), 2)}


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    reference = sections((site / "reference" / "cli.html").read_text())
    commands = registered_commands(typer.main.get_command(app))
    assert {"factstream run", "factstream migrate status", "factstream tokens create"} <= set(commands)
    for path, flags in commands.items():
        anchor = path.replace(" ", "-")
        assert anchor in reference, f"the CLI reference has no section for {path}"
        missing = [flag for flag in flags if flag not in reference[anchor]]
        assert missing == [], f"the CLI reference of {path} does not show {missing}"


@pytest.mark.parametrize(
    ("module", "names"),
    [("factstream", factstream.__all__), ("factstream.testing", factstream.testing.__all__)],
)
def test_the_api_reference_documents_each_public_name(site: Path, module: str, names: list[str]) -> None:
    page = (site / "reference" / "api.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', page))
    assert [name for name in names if f"{module}.{name}" not in anchors] == []


def test_docstring_roles_become_links_and_a_broken_one_fails(site: Path) -> None:
    """The Sphinx roles of the docstrings are links of the API reference; one whose target is gone is a
    cross-reference to nothing (which fails the strict build) rather than text."""
    import griffe

    sys.path.insert(0, str(DOCS / "gen"))
    try:
        import griffe_roles
    finally:
        sys.path.remove(str(DOCS / "gen"))
    page = (site / "reference" / "api.html").read_text()
    assert ":class:`" not in page and ":meth:`" not in page
    assert re.search(r'<a class="autorefs[^>]*href="#factstream.HostApi.call_hook"><code>call_hook</code></a>', page)

    pkg = griffe.load(
        "factstream",
        search_paths=[str(ROOT / "framework")],
        extensions=griffe.load_extensions(griffe_roles.SphinxRoles),
    )
    call_first = pkg["plugin.api.HostApi.call_first"]
    assert "[`call_hook`][factstream.plugin.api.HostApi.call_hook]" in call_first.docstring.value
    shown = griffe_roles.shown_paths(pkg)

    def rendered(role: str) -> str:
        match = griffe_roles.ROLE.search(role)
        assert match is not None
        return griffe_roles.link(call_first, match, pkg, shown)

    assert rendered(":meth:`call_hook`") == "[`call_hook`][factstream.plugin.api.HostApi.call_hook]"
    assert rendered(":class:`~factstream.plugin.manager.PluginHost`") == "`PluginHost`"  # private: code
    assert rendered(":class:`KeyError`") == "`KeyError`"
    assert rendered(":meth:`call_hooks`") == "[`call_hooks`][call_hooks]"  # gone: a broken reference
