"""Replication commands a plugin handles: :class:`CommandHandlerSpec`, registered with ``register_command_handlers``.

The reference's protocol carries commands besides RDATA and POSITION: ``USER_SYNC`` and
``CLEAR_USER_SYNC`` tell the presence writer who is syncing where, ``USER_IP`` feeds the client-IP
table, and so on. The codec knows them all (``factstream.replication.wire``); a plugin handles one
by naming its command class and the stream whose writers act on it. Plugins do not define new
commands (decision 18): what crosses the wire stays the reference's, byte for byte.

Where a command goes. ``host.send_command(cmd)`` runs the handler at once when this instance writes
the stream, and sends the command to the others when some other instance writes it. With TCP
replication commands travel from the instances to the main one only (the reference's direction), so
the stream's writer must be the main instance (a host refuses to start otherwise); with Redis every
instance receives every command, and the stream's writers handle it.

Who may say what. A command that names an instance (``USER_SYNC``'s and ``CLEAR_USER_SYNC``'s
``instance_id``, ``FEDERATION_ACK``'s ``instance_name``) speaks for it: on a link whose peer is one
instance (a TCP client seen from the main instance) it must be that peer's name, and nobody else may
speak for this process (a command under this process's own name coming back over Redis is its own
echo, ignored).

Cleaning up after a process. An instance that sent commands and then goes away leaves their effects
behind (a user marked online by a worker that was killed). When it is gone the host calls the spec's
``forget(host, instance)`` on every instance that handled its commands: at once when the TCP link from
it closes, and, on any transport, within :data:`LIVENESS_SECONDS` of its process ending (each host
holds an instance lease, a PostgreSQL advisory lock its session keeps: the database frees it when the
process dies, however it died). Going the other way, ``resend(host)`` gives the commands this process
sends again each time its replication link (re)connects, so that what a handler forgot when a link
broke comes back (the reference re-sends its syncing users).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from factstream.names import check_name

if TYPE_CHECKING:
    from factstream.plugin.api import HostApi
    from factstream.replication import wire

CmdT = TypeVar("CmdT", bound="wire.Command")

#: The commands the core itself handles: the link's own and the streams'. No plugin may take them.
CORE_COMMANDS = frozenset({"SERVER", "RDATA", "POSITION", "ERROR", "PING", "NAME", "REPLICATE"})
#: Which field of a command names the instance it speaks for (``USER_SYNC``'s ``instance_id``...).
SPEAKS_FOR: dict[str, str] = {
    "USER_SYNC": "instance_id",
    "CLEAR_USER_SYNC": "instance_id",
    "FEDERATION_ACK": "instance_name",
}
#: How often a host checks that the instances whose commands it handled are still alive.
LIVENESS_SECONDS = 2.0


@dataclass(frozen=True)
class AnyCommandHandlerSpec:
    """A :class:`CommandHandlerSpec` of any command (what ``register_command_handlers``'s ``register``
    takes; not generic, so that mypy checks each spec where it is built)."""


@dataclass(frozen=True)
class CommandHandlerSpec(AnyCommandHandlerSpec, Generic[CmdT]):
    """``handler(host, sender, command)`` runs on the writers of ``stream`` for every ``command`` received.

    * ``command``: one of the codec's command classes that names the instance it speaks for
      (``UserSyncCommand``, ``ClearUserSyncCommand``, ``FederationAckCommand`` of
      ``factstream.replication.wire``): that is what lets the host check who sent it and clean up
      after an instance that went away. One plugin handles each command.
    * ``stream``: the stream whose writers handle it (the plugin's own, usually).
    * ``handler``: ``(host, sender, command)``; ``sender`` is the instance the command came from (its
      ``instance_id`` where it names one, else the link's peer, else ``""``). It may be a coroutine
      function; handlers run one command at a time, in the order the commands arrived.
    * ``forget``: ``(host, instance)``, called where commands were handled once ``instance`` is gone
      (module docstring): undo what its commands did.
    * ``resend``: ``(host) -> commands``, on every instance: what it sends again whenever its
      replication link (re)connects.
    """

    command: type[CmdT]
    stream: str
    handler: Callable[[HostApi, str, CmdT], Awaitable[None] | None]
    forget: Callable[[HostApi, str], Awaitable[None] | None] | None = None
    resend: Callable[[HostApi], Iterable[wire.Command]] | None = None

    def __post_init__(self) -> None:
        from factstream.replication import wire  # the codec only: ``import factstream`` does not load it

        cls = self.command
        if not (isinstance(cls, type) and cls in wire.BUILTIN_COMMANDS):
            raise ValueError(f"a command handler takes one of the codec's command classes, not {cls!r}")
        if cls.NAME in CORE_COMMANDS:
            raise ValueError(f"command {cls.NAME} is the core's: a plugin cannot handle it")
        if cls.NAME not in SPEAKS_FOR:
            raise ValueError(
                f"command {cls.NAME} names no instance, so who sent it cannot be checked nor cleaned up after: "
                f"a plugin handles {', '.join(sorted(SPEAKS_FOR))}"
            )
        check_name("stream", self.stream)
        for what in ("handler", "forget", "resend"):
            value = getattr(self, what)
            if (value is not None or what == "handler") and not callable(value):
                raise ValueError(f"handler of {cls.NAME}: {what} must be callable")

    @property
    def name(self) -> str:
        """The command's wire name (``USER_SYNC``)."""
        return self.command.NAME


RegisterCommandHandler = Callable[[AnyCommandHandlerSpec], None]
"""The ``register`` callable of ``register_command_handlers``: takes one `CommandHandlerSpec` per call."""


def speaks_for(command: wire.Command) -> str | None:
    """The instance ``command`` speaks for, if it names one."""
    field = SPEAKS_FOR.get(command.NAME)
    value: Any = getattr(command, field) if field is not None else None
    return value if isinstance(value, str) else None
