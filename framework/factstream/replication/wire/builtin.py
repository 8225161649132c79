"""The built-in commands, in Synapse's order, and which side of a TCP link may send each.

Every command of Synapse's TCP replication protocol is defined, so that whatever a Synapse peer sends
parses (RDATA and POSITION, the stream commands, are in :mod:`factstream.replication.wire.rdata`).
Each docstring gives the wire form; where Synapse's documentation and its code disagree, the code
(and so the wire) wins, and the docstring says so.
"""

from __future__ import annotations

from typing import ClassVar, Final, Self

from factstream.replication.wire.command import (
    Command,
    CommandEncodeError,
    CommandParseError,
    check_text,
    check_word,
    excerpt,
    int_text,
    json_text,
    parse_int,
    parse_typed_json,
    split_fields,
)
from factstream.replication.wire.rdata import PositionCommand, RdataCommand

__all__ = [
    "BUILTIN_COMMANDS",
    "CLIENT_SENDS",
    "SERVER_SENDS",
    "CancelTaskCommand",
    "ClearUserSyncCommand",
    "ErrorCommand",
    "FederationAckCommand",
    "LockReleasedCommand",
    "NameCommand",
    "NewActiveTaskCommand",
    "PingCommand",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ServerCommand",
    "UserIpCommand",
    "UserSyncCommand",
]


class ServerCommand(Command, frozen=True):
    """``SERVER <server_name>``: sent by a TCP server on connect; the client checks the name it expects."""

    NAME: ClassVar[str] = "SERVER"
    server_name: str

    def to_body(self) -> str:
        return check_text(self.NAME, "server_name", self.server_name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class ErrorCommand(Command, frozen=True):
    """``ERROR <message>``: either side reports an error, usually before closing the connection."""

    NAME: ClassVar[str] = "ERROR"
    message: str

    def to_body(self) -> str:
        return check_text(self.NAME, "message", self.message)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class PingCommand(Command, frozen=True):
    """``PING <data>``: keep-alive from either side; the data is free text (in practice a ms timestamp)."""

    NAME: ClassVar[str] = "PING"
    data: str

    def to_body(self) -> str:
        return check_text(self.NAME, "data", self.data)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class NameCommand(Command, frozen=True):
    """``NAME <name>``: a TCP client tells the server a human-friendly name for the connection."""

    NAME: ClassVar[str] = "NAME"
    name: str

    def to_body(self) -> str:
        return check_text(self.NAME, "name", self.name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class ReplicateCommand(Command, frozen=True):
    """``REPLICATE ``: "everyone, announce your stream positions" (sent on connect).

    Sent with an empty body, hence the trailing space. Like Synapse we ignore a body on receipt:
    older Synapse versions sent ``REPLICATE <stream> <token>``.
    """

    NAME: ClassVar[str] = "REPLICATE"

    def to_body(self) -> str:
        return ""

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls()


class UserSyncCommand(Command, frozen=True):
    """``USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>``: presence input.

    A worker tells the presence writer that a user started or stopped syncing on it. A missing device
    is the word ``None`` on the wire, so a device really called ``None`` cannot be sent.
    """

    NAME: ClassVar[str] = "USER_SYNC"
    instance_id: str
    user_id: str
    device_id: str | None
    is_syncing: bool
    last_sync_ms: int

    def to_body(self) -> str:
        name = self.NAME
        device_id = self.device_id
        if device_id == "None":
            raise CommandEncodeError("USER_SYNC: device_id 'None' cannot be sent (the wire word for no device)")
        if type(self.is_syncing) is not bool:
            raise CommandEncodeError(f"USER_SYNC: is_syncing must be a bool, got {type(self.is_syncing).__name__}")
        return " ".join(
            (
                check_word(name, "instance_id", self.instance_id),
                check_word(name, "user_id", self.user_id),
                "None" if device_id is None else check_word(name, "device_id", device_id),
                "start" if self.is_syncing else "end",
                int_text(name, "last_sync_ms", self.last_sync_ms),
            )
        )

    @classmethod
    def from_body(cls, body: str) -> Self:
        instance_id, user_id, device_id, state, last_sync_ms = split_fields("USER_SYNC", body, 5)
        if state != "start" and state != "end":
            raise CommandParseError(f"USER_SYNC: state {excerpt(state)} is not 'start' or 'end'")
        return cls(
            instance_id,
            user_id,
            None if device_id == "None" else device_id,
            state == "start",
            parse_int("USER_SYNC", "last_sync_ms", last_sync_ms),
        )


class FederationAckCommand(Command, frozen=True):
    """``FEDERATION_ACK <instance_name> <token>``: the federation sender processed up to ``token``."""

    NAME: ClassVar[str] = "FEDERATION_ACK"
    instance_name: str
    token: int

    def to_body(self) -> str:
        name = self.NAME
        return check_word(name, "instance_name", self.instance_name) + " " + int_text(name, "token", self.token)

    @classmethod
    def from_body(cls, body: str) -> Self:
        parts = body.split(" ")  # exactly two fields, as Synapse's unbounded split demands
        if len(parts) != 2:
            raise CommandParseError(f"FEDERATION_ACK: expected 2 fields, got {len(parts)}")
        return cls(parts[0], parse_int("FEDERATION_ACK", "token", parts[1]))


_UserIpArray = tuple[str, str, str, str | None, int]


class UserIpCommand(Command, frozen=True):
    """``USER_IP <user_id> <JSON [access_token, ip, user_agent, device_id, last_seen]>``: client activity.

    Published on the Redis channel ``<prefix>/USER_IP``, which only the instances that record client
    IPs subscribe to. (Synapse's docstring shows another field order; its code, and so the wire, uses
    this one.) The access token is a credential: it is left out of ``repr``.
    """

    NAME: ClassVar[str] = "USER_IP"
    user_id: str
    access_token: str
    ip: str
    user_agent: str
    device_id: str | None
    last_seen: int

    def to_body(self) -> str:
        name = self.NAME
        for field in ("access_token", "ip", "user_agent"):
            check_text(name, field, getattr(self, field))
        if self.device_id is not None:
            check_text(name, "device_id", self.device_id)
        int_text(name, "last_seen", self.last_seen)
        array = (self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen)
        return check_word(name, "user_id", self.user_id) + " " + json_text(name, "body", array)

    @classmethod
    def from_body(cls, body: str) -> Self:
        user_id, array_json = split_fields("USER_IP", body, 2)
        what = "[access_token, ip, user_agent, device_id, last_seen]"
        array: _UserIpArray = parse_typed_json("USER_IP", what, array_json, _UserIpArray)
        return cls(user_id, *array)

    @classmethod
    def redis_channel(cls, prefix: str) -> str:
        return f"{prefix}/USER_IP"

    def __repr__(self) -> str:
        return (
            f"UserIpCommand(user_id={self.user_id!r}, access_token=<redacted>, ip={self.ip!r}, "
            f"user_agent={self.user_agent!r}, device_id={self.device_id!r}, last_seen={self.last_seen!r})"
        )


class RemoteServerUpCommand(Command, frozen=True):
    """``REMOTE_SERVER_UP <server_name>``: a remote homeserver seems reachable again; reset its backoff."""

    NAME: ClassVar[str] = "REMOTE_SERVER_UP"
    server_name: str

    def to_body(self) -> str:
        return check_text(self.NAME, "server_name", self.server_name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class ClearUserSyncCommand(Command, frozen=True):
    """``CLEAR_USER_SYNC <instance_id>``: a worker shutting down; forget the users syncing on it."""

    NAME: ClassVar[str] = "CLEAR_USER_SYNC"
    instance_id: str

    def to_body(self) -> str:
        return check_text(self.NAME, "instance_id", self.instance_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class LockReleasedCommand(Command, frozen=True):
    """``LOCK_RELEASED ["<instance_name>","<lock_name>","<lock_key>"]``: a database lock was released.

    The whole body is one JSON array (so each field may hold any character). Receivers ignore their
    own echoes.
    """

    NAME: ClassVar[str] = "LOCK_RELEASED"
    instance_name: str
    lock_name: str
    lock_key: str

    def to_body(self) -> str:
        name = self.NAME
        for field in ("instance_name", "lock_name", "lock_key"):
            check_text(name, field, getattr(self, field))
        return json_text(name, "body", [self.instance_name, self.lock_name, self.lock_key])

    @classmethod
    def from_body(cls, body: str) -> Self:
        what = "[instance_name, lock_name, lock_key]"
        fields: tuple[str, str, str] = parse_typed_json("LOCK_RELEASED", what, body, tuple[str, str, str])
        return cls(*fields)


class NewActiveTaskCommand(Command, frozen=True):
    """``NEW_ACTIVE_TASK <task_id>``: the task scheduler tells the background-tasks instance to run a task.

    Synapse's docstring shows the ID in quotes; its code sends it bare, and so do we.
    """

    NAME: ClassVar[str] = "NEW_ACTIVE_TASK"
    task_id: str

    def to_body(self) -> str:
        return check_text(self.NAME, "task_id", self.task_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class CancelTaskCommand(Command, frozen=True):
    """``CANCEL_TASK <task_id>``: the task scheduler asks the instance running a task to cancel it."""

    NAME: ClassVar[str] = "CANCEL_TASK"
    task_id: str

    def to_body(self) -> str:
        return check_text(self.NAME, "task_id", self.task_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


#: Every built-in command class.
BUILTIN_COMMANDS: Final[tuple[type[Command], ...]] = (
    ServerCommand,
    RdataCommand,
    PositionCommand,
    ErrorCommand,
    PingCommand,
    NameCommand,
    ReplicateCommand,
    UserSyncCommand,
    FederationAckCommand,
    UserIpCommand,
    RemoteServerUpCommand,
    ClearUserSyncCommand,
    LockReleasedCommand,
    NewActiveTaskCommand,
    CancelTaskCommand,
)

#: Names of the commands a TCP *server* may send; a client receiving anything else sends
#: ``ERROR invalid command`` and closes. Redis has no direction and does not check.
SERVER_SENDS: Final[frozenset[str]] = frozenset(
    cls.NAME
    for cls in (
        ServerCommand,
        RdataCommand,
        PositionCommand,
        ErrorCommand,
        PingCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
    )
)

#: Names of the commands a TCP *client* may send. ``NEW_ACTIVE_TASK`` and ``CANCEL_TASK`` are in
#: neither set: they only travel over Redis.
CLIENT_SENDS: Final[frozenset[str]] = frozenset(
    cls.NAME
    for cls in (
        NameCommand,
        ReplicateCommand,
        PingCommand,
        UserSyncCommand,
        ClearUserSyncCommand,
        FederationAckCommand,
        UserIpCommand,
        ErrorCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
    )
)
