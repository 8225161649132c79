"""Render the stream-plugin template (``templates/stream-plugin``) into a new plugin project."""

from __future__ import annotations

import datetime
import string
from pathlib import Path

from factstream.plugin.specs import check_name
from factstream.resources import templates_dir


def render_stream_plugin(name: str, target: Path, description: str = "") -> Path:
    """Write a plugin project for stream ``name`` into ``target`` (which must not exist); return it."""
    check_name("stream", name)
    if target.exists():
        raise FileExistsError(f"{target} already exists")
    values = {
        "name": name,
        "name_dashed": name.replace("_", "-"),
        "row_class": "".join(part.title() for part in name.split("_")) + "Row",
        "description": description or f"the {name} stream.",
        "date": datetime.date.today().isoformat(),
    }
    source = templates_dir() / "stream-plugin"
    for path in sorted(source.rglob("*.tmpl")):
        rel = path.relative_to(source).as_posix().removesuffix(".tmpl").replace("package/", f"factstream_{name}/", 1)
        out = target / string.Template(rel).substitute(values)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(string.Template(path.read_text()).substitute(values))
    return target
