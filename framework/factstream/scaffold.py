"""Render the stream-plugin template (``templates/stream-plugin``) into a new plugin project.

The template is a directory of Mako files (``*.mako``, the engine alembic already brings). In paths,
``_package_``, ``_name_`` and ``_revision_`` stand for the package, the stream name and the first
migration's revision ID, and ``dot_`` for a leading dot. :data:`OPTIONAL_FILES` names the files an
option leaves out. ``factstream new-stream`` (``factstream.scaffold_command``) is the command around it.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from factstream.names import check_name
from factstream.resources import migrations_dir, templates_dir

#: Files rendered only when an option is on: template path -> the option.
OPTIONAL_FILES = {"tests/test__name__export.py.mako": "export"}
#: The default name of the instance that writes a new stream (``stream_writers``).
DEFAULT_WRITERS = ("main",)
#: The longest name of a new stream: the longest identifier derived from it, the unique constraint
#: ``<name>_stream_id_key`` PostgreSQL names for the table's ``stream_id`` column (14 characters more),
#: must fit PostgreSQL's 63 characters, or PostgreSQL would silently truncate it.
MAX_NAME_LENGTH = 49
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class StreamPlugin:
    """What to render: the stream's name and the choices ``factstream new-stream`` asks for."""

    name: str
    description: str = ""
    writers: Sequence[str] = DEFAULT_WRITERS
    sync: bool = True
    export: bool = True
    #: Part of a factstream checkout's uv workspace (``plugins/<name>``): factstream comes from the checkout.
    workspace: bool = False
    #: The first migration's revision ID (random by default, like alembic's).
    revision: str = field(default_factory=lambda: uuid.uuid4().hex[-12:])

    def __post_init__(self) -> None:
        # The length first: check_name's own limit (63, any identifier) is not a new stream's.
        if len(self.name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"stream name {self.name!r} is too long for a new stream: at most {MAX_NAME_LENGTH} characters "
                f"(it has {len(self.name)}), so that the longest name derived from it, the table's constraint "
                "<name>_stream_id_key, fits PostgreSQL's 63"
            )
        check_name("stream", self.name)
        if self.name in _reserved_words():
            raise ValueError(f"stream name {self.name!r} is an SQL reserved word; the table would need quoting")
        if not self.writers:
            raise ValueError("name at least one writer instance")
        for writer in self.writers:
            if not _INSTANCE_RE.match(writer):
                raise ValueError(f"invalid instance name {writer!r}: use letters, digits, '_', '.', '-'")
        if len(set(self.writers)) != len(self.writers):
            raise ValueError(f"writer instances named twice: {', '.join(self.writers)}")

    @property
    def package(self) -> str:
        return f"factstream_{self.name}"

    @property
    def distribution(self) -> str:
        return f"factstream-{self.name.replace('_', '-')}"

    def values(self) -> dict[str, object]:
        """The variables every template sees."""
        camel = "".join(part.title() for part in self.name.split("_"))
        description = (self.description or f"the {self.name} stream").strip()
        writers = list(self.writers)
        reader = next(n for n in (f"reader{i}" for i in range(1, len(writers) + 2)) if n not in writers)
        instances = ["main", *(w for w in writers if w != "main"), reader]
        return {
            "name": self.name,
            "upper": self.name.upper(),
            "camel": camel,
            "package": self.package,
            "dist": self.distribution,
            "description": description,
            "description_py": _escape(description),
            "description_toml": _escape(description),
            "writers": writers,
            "writers_py": repr(writers).replace("'", '"'),
            "reader": reader,
            "instances": instances,
            "instances_py": repr(instances).replace("'", '"'),
            "sync": self.sync,
            "export": self.export,
            "workspace": self.workspace,
            "revision": self.revision,
            "core_head": core_head(),
            "create_date": datetime.datetime.now().replace(microsecond=0).isoformat(sep=" "),
        }


def _reserved_words() -> frozenset[str]:
    from sqlalchemy.dialects.postgresql.base import RESERVED_WORDS

    return frozenset(RESERVED_WORDS)


def _escape(text: str) -> str:
    """``text`` inside a double-quoted Python or TOML string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def core_head() -> str:
    """The newest revision of factstream's own migration branch, which a plugin's first revision needs."""
    from alembic.script import ScriptDirectory

    versions = migrations_dir() / "versions"
    script = ScriptDirectory(str(migrations_dir()), version_locations=[str(versions)])
    heads = script.get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"factstream's migrations have {len(heads)} heads, expected one: {heads}")
    return heads[0]


def template_files(plugin: StreamPlugin) -> dict[str, Path]:
    """``{output path: template file}`` for ``plugin``: what rendering writes, relative to its directory."""
    source = templates_dir() / "stream-plugin"
    options = {"sync": plugin.sync, "export": plugin.export}
    files: dict[str, Path] = {}
    for path in sorted(source.rglob("*.mako")):
        rel = path.relative_to(source).as_posix()
        if rel in OPTIONAL_FILES and not options[OPTIONAL_FILES[rel]]:
            continue
        out = rel.removesuffix(".mako")
        out = out.replace("_package_", plugin.package).replace("_revision_", plugin.revision)
        out = out.replace("_name_", plugin.name)
        out = "/".join(part.replace("dot_", ".", 1) if part.startswith("dot_") else part for part in out.split("/"))
        files[out] = path
    return files


def render(plugin: StreamPlugin) -> dict[str, str]:
    """``{output path: text}``: every file of the plugin project, rendered in memory."""
    from mako.template import Template  # type: ignore[import-untyped]

    values = plugin.values()
    rendered: dict[str, str] = {}
    for out, path in template_files(plugin).items():
        template = Template(filename=str(path), strict_undefined=True, output_encoding=None)
        rendered[out] = template.render(**values)
    return rendered


def write_plugin(plugin: StreamPlugin, target: Path) -> list[Path]:
    """Render ``plugin`` into ``target`` (missing or empty); returns the files written, in order.

    Everything is rendered before the first file is written, so a template error writes nothing.
    """
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already exists and is not an empty directory")
    files = render(plugin)
    written: list[Path] = []
    for rel, text in files.items():
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        written.append(out)
    return written
