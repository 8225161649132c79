"""Several streams' parts of one ``/sync`` section, merged (``StreamSpec.sync_section``).

A stream that fills a section returns it as a mapping; streams may share a section. The events plugin
fills ``rooms`` with each room's timeline and state, and a typing or receipts plugin adds each room's
``ephemeral`` events to the same ``rooms.join.<room>`` without either plugin knowing of the other: the
parts are merged here, in the order of the streams. Mappings merge key by key, at any depth; lists at
the same place are concatenated (the earlier stream's items first); anything else at one place must be
equal, or the merge is refused naming the streams and the place (two plugins disagreeing on a room's
``limited`` is a bug in one of them, not something to settle silently).

The parts are not changed: a mapping or list that another part extends is copied first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from factstream.errors import PluginError

__all__ = ["SectionParts"]


class SectionParts:
    """The sections of one ``/sync`` answer, built from the streams' parts (module docstring)."""

    def __init__(self) -> None:
        self.sections: dict[str, Any] = {}
        #: Which streams gave a part of each section so far, in order.
        self._by: dict[str, list[str]] = {}

    def add(self, section: str, stream: str, part: Mapping[str, Any]) -> None:
        """Merge ``stream``'s ``part`` of ``section`` into what the earlier streams gave."""
        earlier = self._by.setdefault(section, [])
        if section not in self.sections:
            self.sections[section] = part
        else:
            self.sections[section] = _merged(self.sections[section], part, section, stream, earlier)
        earlier.append(stream)


def _merged(have: Any, new: Any, where: str, stream: str, earlier: Sequence[str]) -> Any:
    if isinstance(have, Mapping) and isinstance(new, Mapping):
        out = dict(have)
        for key, value in new.items():
            out[key] = _merged(out[key], value, f"{where}.{key}", stream, earlier) if key in out else value
        return out
    if isinstance(have, list) and isinstance(new, list):
        return [*have, *new]
    if type(have) is type(new) and have == new:
        return have
    raise PluginError(
        f"/sync section {where.split('.', 1)[0]!r}: stream {stream!r} sets {where} to {new!r}, where an earlier"
        f" stream ({', '.join(map(repr, earlier))}) set {have!r}: the streams sharing a section must agree"
    )
