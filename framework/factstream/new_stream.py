"""``factstream new-stream``: scaffold a stream plugin project from ``templates/stream-plugin``.

Everything is checked before anything is written: the name (a valid stream name, no plugin or stream
of that name installed), the writers, the target directory (missing or empty). Each refusal is a
:class:`~factstream.errors.FactstreamError`, shown by the CLI as one line with exit code 2.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console

from factstream.errors import FactstreamError
from factstream.plugin.manager import PluginHost
from factstream.scaffold import DEFAULT_WRITERS, StreamPlugin, write_plugin

_MEMBERS_RE = re.compile(r"^(\s*members\s*=\s*\[)([^\]]*)(\])", re.MULTILINE)


@dataclass
class Choices:
    """The options of one ``new-stream``; ``None`` where the user gave none (asked for on a terminal)."""

    name: str
    directory: Path | None
    description: str | None
    writers: str | None
    sync: bool | None
    export: bool | None
    workspace: bool


def new_stream(choices: Choices, plugins: PluginHost, out: Console, *, interactive: bool | None = None) -> Path:
    """Check ``choices``, ask for what is missing when stdin is a terminal, render; returns the directory."""
    if interactive is None:
        interactive = sys.stdin.isatty()
    plugin = _plugin(choices, interactive)
    _check_not_installed(plugin.name, plugins)
    target = _target(choices, plugin)
    if choices.workspace:
        plugin = StreamPlugin(
            plugin.name, plugin.description, plugin.writers, plugin.sync, plugin.export, workspace=True
        )
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FactstreamError(f"{target} already exists and is not empty; choose another directory")
    written = write_plugin(plugin, target)
    shown = _shown(target)
    out.print(
        f"created the {plugin.name} stream plugin in {shown} ({len(written)} files)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    for path in written:
        out.print(f"  {path.relative_to(target).as_posix()}", highlight=False, markup=False, soft_wrap=True)
    if choices.workspace:
        root = target.parent.parent
        _wire_workspace(root, target)
        steps = [
            "uv sync --all-packages --inexact",
            f"uv run factstream migrate --plugin {plugin.name}",
            f"uv run pytest {shown}",
        ]
    else:
        steps = [f"cd {shown}", "uv pip install -e .      # next to factstream", "factstream migrate", "pytest"]
    out.print("next:", highlight=False, markup=False, soft_wrap=True)
    for step in steps:
        out.print(f"  {step}", highlight=False, markup=False, soft_wrap=True)
    return target


def _plugin(choices: Choices, interactive: bool) -> StreamPlugin:
    name = choices.name
    try:
        StreamPlugin(name)  # the name alone, before asking anything else
    except ValueError as exc:
        raise FactstreamError(str(exc)) from None
    description = choices.description
    if description is None:
        description = typer.prompt("description", default=f"the {name} stream") if interactive else ""
    writers_text = choices.writers
    if writers_text is None:
        default = ",".join(DEFAULT_WRITERS)
        writers_text = (
            typer.prompt("instances that write it (comma-separated)", default=default) if interactive else default
        )
    writers = tuple(w.strip() for w in writers_text.split(",") if w.strip())
    sync = choices.sync
    if sync is None:
        sync = typer.confirm("show each user their rows in /sync?", default=True) if interactive else True
    export = choices.export
    if export is None:
        export = typer.confirm("add a Spark export job?", default=True) if interactive else True
    if "\n" in description or "\r" in description:
        raise FactstreamError("--description must be one line")
    try:
        return StreamPlugin(name, description, writers, sync, export)
    except ValueError as exc:
        raise FactstreamError(f"--writers {writers_text!r}: {exc}") from None


def _check_not_installed(name: str, plugins: PluginHost) -> None:
    if name in plugins.plugins:
        info = plugins.plugins[name]
        raise FactstreamError(f"a plugin named {name!r} is already installed ({info.module}); choose another name")
    owner = next((p for p in plugins.plugins if name in plugins.registered_by(p)["streams"]), None)
    if owner is not None:
        raise FactstreamError(f"a stream named {name!r} is already registered by plugin {owner!r}; choose another name")


def _target(choices: Choices, plugin: StreamPlugin) -> Path:
    if not choices.workspace:
        return (choices.directory or Path(plugin.distribution)).absolute()
    if choices.directory is not None:
        raise FactstreamError("give a directory or --workspace, not both: --workspace writes plugins/<name>/")
    root = _checkout_root(Path.cwd())
    return root / "plugins" / plugin.name


def _checkout_root(start: Path) -> Path:
    """The factstream checkout containing ``start``: the directory whose pyproject.toml is factstream's."""
    for directory in (start.absolute(), *start.absolute().parents):
        pyproject = directory / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except tomllib.TOMLDecodeError:
            continue
        if project.get("name") == "factstream":
            return directory
    raise FactstreamError(
        f"--workspace: {start.absolute()} is not inside a factstream checkout (no pyproject.toml of factstream)"
    )


def _wire_workspace(root: Path, target: Path) -> None:
    """Make ``target`` a member of the checkout's uv workspace, unless a members glob already covers it."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    members = tomllib.loads(text).get("tool", {}).get("uv", {}).get("workspace", {}).get("members", [])
    rel = target.relative_to(root)
    if any(rel.match(pattern) or rel.as_posix() == pattern for pattern in members):
        return
    entry = f'"{rel.as_posix()}"'
    match = _MEMBERS_RE.search(text)
    if match is None:
        text = text.rstrip("\n") + f"\n\n[tool.uv.workspace]\nmembers = [{entry}]\n"
    else:
        inner = match.group(2).rstrip().rstrip(",")
        joined = f"{inner}, {entry}" if inner.strip() else entry
        text = text[: match.start(2)] + joined + text[match.end(2) :]
    pyproject.write_text(text)


def _shown(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd()).as_posix() or "."
    except ValueError:
        return str(path)
