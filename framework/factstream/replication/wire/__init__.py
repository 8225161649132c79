"""The replication wire codec: Synapse's TCP replication line protocol, byte for byte.

Everything that turns commands into lines and lines into commands, and nothing that acts on them:
the transports (:mod:`~factstream.replication.tcp`, :mod:`~factstream.replication.redis`) and the
reader (:mod:`~factstream.replication.handler`) import this package, never each other for it.

* :mod:`.json` — JSON exactly as Synapse writes and reads it (msgspec where it writes the same bytes).
* :mod:`.command` — the :class:`Command` base class, the codec's errors, the field helpers, one line's encoding.
* :mod:`.rdata` — ``RDATA`` and ``POSITION``, the stream commands, and the streamer's bulk RDATA encoding.
* :mod:`.builtin` — the other built-in commands and which side of a TCP link may send each.
* :mod:`.parse` — parsing a received line (:func:`parse_command`).
* :mod:`.runs` — reading many RDATA lines at once (:class:`RdataRun`).

The names below are what the rest of the core uses; import them from this package.
"""

from factstream.replication.wire.builtin import (
    BUILTIN_COMMANDS,
    CLIENT_SENDS,
    SERVER_SENDS,
    CancelTaskCommand,
    ClearUserSyncCommand,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
)
from factstream.replication.wire.command import (
    BlankLineError,
    Command,
    CommandEncodeError,
    CommandParseError,
    ProtocolError,
    encode_line,
)
from factstream.replication.wire.json import decode_json, encode_json
from factstream.replication.wire.parse import parse_command
from factstream.replication.wire.rdata import PositionCommand, RdataCommand, encode_rdata_lines, encode_rdata_run
from factstream.replication.wire.runs import RdataRun, json_array, split_runs, uniform_run

__all__ = [
    "BUILTIN_COMMANDS",
    "CLIENT_SENDS",
    "SERVER_SENDS",
    "BlankLineError",
    "CancelTaskCommand",
    "ClearUserSyncCommand",
    "Command",
    "CommandEncodeError",
    "CommandParseError",
    "ErrorCommand",
    "FederationAckCommand",
    "LockReleasedCommand",
    "NameCommand",
    "NewActiveTaskCommand",
    "PingCommand",
    "PositionCommand",
    "ProtocolError",
    "RdataCommand",
    "RdataRun",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ServerCommand",
    "UserIpCommand",
    "UserSyncCommand",
    "decode_json",
    "encode_json",
    "encode_line",
    "encode_rdata_lines",
    "encode_rdata_run",
    "json_array",
    "parse_command",
    "split_runs",
    "uniform_run",
]
