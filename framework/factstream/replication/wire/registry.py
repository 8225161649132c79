"""Parsing a received line into its command, and the registry of the commands a process understands.

Parsing follows Synapse exactly where a line is well-formed:

* the line is split at the **first** space into name and body (no space: the body is ``""``);
* the name is looked up in a :class:`CommandRegistry` (unknown names fail);
* the command parses its body (see :mod:`factstream.replication.wire.command` for the field rules).

We are stricter than Synapse in one more place: a line handed to :func:`parse_command` may not contain
a newline other than one trailing line terminator. A malformed line raises
:class:`~factstream.replication.wire.command.CommandParseError` whose message starts with the command
name.

Blank lines. The protocol says blank (whitespace-only) lines are ignored. :func:`parse_command`
signals them by raising :class:`BlankLineError`, a subclass of :class:`CommandParseError`: a transport
that wants the documented behaviour catches that subclass and carries on, and a caller that treats
every failure alike (the Redis transport only logs) needs no special case. Raising costs nothing on
the normal path, because blankness is only checked after the name lookup failed.

Extending. A plugin defines a subclass of :class:`Command` with a unique ``NAME``, ``to_body`` and
``from_body``, and registers it in the host's :class:`CommandRegistry` at startup. The built-in
commands live in :data:`DEFAULT_REGISTRY`, which is read-only; ``parse_command`` uses it unless given
another registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final, TypeVar

from factstream.errors import PluginError
from factstream.replication.wire.builtin import BUILTIN_COMMANDS
from factstream.replication.wire.command import (
    EXCERPT_LENGTH,
    BlankLineError,
    Command,
    CommandParseError,
    excerpt,
)

__all__ = ["DEFAULT_REGISTRY", "CommandRegistry", "parse_command"]

C = TypeVar("C", bound=type[Command])


class CommandRegistry:
    """The command classes one process understands, by wire name.

    A new registry starts with the built-in commands (pass ``commands=()`` for an empty one).
    Plugins add theirs with :meth:`register` during startup; the host then calls :meth:`freeze` so
    the set cannot change while connections are open. Names are unique: a second class for a name
    is refused with a :class:`~factstream.errors.PluginError` naming both classes.
    """

    __slots__ = ("_classes", "_frozen", "_parsers")

    def __init__(self, commands: Iterable[type[Command]] = BUILTIN_COMMANDS) -> None:
        self._classes: dict[str, type[Command]] = {}
        # name -> bound ``from_body``: what ``parse_command`` calls, looked up once per line.
        self._parsers: dict[str, Callable[[str], Command]] = {}
        self._frozen = False
        for command_class in commands:
            self.register(command_class)

    def register(self, command_class: C) -> C:
        """Add a command class; returns it, so it can be used as a class decorator."""
        if self._frozen:
            raise PluginError(
                f"cannot register replication command {_qualname(command_class)}: the registry is frozen "
                "(register commands at startup, into the host's CommandRegistry)"
            )
        if not (isinstance(command_class, type) and issubclass(command_class, Command)):
            raise PluginError(f"{command_class!r} is not a subclass of factstream's replication Command")
        name = command_class.__dict__.get("NAME")
        if not isinstance(name, str) or not name or not name.isascii() or not name.isprintable() or " " in name:
            raise PluginError(
                f"replication command {_qualname(command_class)} must define NAME as a non-empty "
                f"printable ASCII word without spaces, got {name!r}"
            )
        missing = [
            method
            for method in ("to_body", "from_body")
            # ``__func__`` unwraps the classmethod, which is bound to a different class each time.
            if getattr(getattr(command_class, method), "__func__", getattr(command_class, method))
            is getattr(getattr(Command, method), "__func__", getattr(Command, method))
        ]
        if missing:
            raise PluginError(
                f"replication command {name} ({_qualname(command_class)}) does not define {' or '.join(missing)}"
            )
        existing = self._classes.get(name)
        if existing is not None:
            raise PluginError(
                f"replication command {name} is already registered by {_qualname(existing)}; "
                f"{_qualname(command_class)} cannot register it again"
            )
        self._classes[name] = command_class
        self._parsers[name] = command_class.from_body
        return command_class

    def freeze(self) -> None:
        """Refuse further registrations (the set of commands is fixed once the process runs)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def get(self, name: str) -> type[Command] | None:
        """The class registered for a wire name, if any."""
        return self._classes.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[type[Command]]:
        return iter(self._classes.values())

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"CommandRegistry({sorted(self._classes)!r}, frozen={self._frozen})"


def _qualname(cls: object) -> str:
    """``module.Class`` for messages: the module says which plugin a class comes from."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


#: The built-in commands, read-only; what :func:`parse_command` uses when given no registry.
DEFAULT_REGISTRY: Final = CommandRegistry()
DEFAULT_REGISTRY.freeze()
_DEFAULT_PARSERS: Final = DEFAULT_REGISTRY._parsers


def _decode_line(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        name = line[:EXCERPT_LENGTH].partition(b" ")[0].decode("utf-8", "replace")
        raise CommandParseError(f"{name}: line is not valid UTF-8: {error}") from None


def parse_command(line: str | bytes, registry: CommandRegistry | None = None) -> Command:
    """Parse one received line into its command (see the module docstring for the rules).

    ``line`` may end in one ``"\\n"`` or ``"\\r\\n"``, which is removed; bytes must be UTF-8. Raises
    :class:`BlankLineError` for an empty or whitespace-only line (to be ignored) and
    :class:`CommandParseError` for anything else that is not a valid command.
    """
    text = line if isinstance(line, str) else _decode_line(line)
    if "\n" in text:
        if text[-2:] == "\r\n":
            text = text[:-2]
        elif text[-1] == "\n":
            text = text[:-1]
        if "\n" in text:
            raise CommandParseError(f"{text.partition(' ')[0]}: a line cannot contain a newline")
    name, _, body = text.partition(" ")
    parser = (_DEFAULT_PARSERS if registry is None else registry._parsers).get(name)
    if parser is None:
        if not text.strip():
            raise BlankLineError("blank line")
        raise CommandParseError(f"unknown command {excerpt(name)}")
    try:
        return parser(body)
    except CommandParseError:
        raise
    except ValueError as error:  # a plugin's from_body may raise plain ValueError
        raise CommandParseError(f"{name}: {error}") from error
