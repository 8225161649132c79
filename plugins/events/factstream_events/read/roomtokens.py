"""Room tokens at the HTTP edge: the token a client gives, read strictly, and the one it is given.

The grammar is ``factstream_events.rules.tokens`` (``RoomToken``); here it meets the deployment. A
token's writers are instance IDs, turned into the names of the events stream's writers (a 400 naming
the parameter when an ID is no instance's: a token of another deployment, or made up), and the
positions a read stops at become the live token the answer carries (``s<stream>`` when every writer is
at one position, else ``m...``).
"""

from __future__ import annotations

from factstream import HostApi
from factstream_events.rules.errors import InvalidParam
from factstream_events.rules.tokens import Positions, RoomToken, TokenError, live_token, positions_of


def parse_token(name: str, text: str | None) -> RoomToken | None:
    """The room token a client gave as parameter ``name`` (None: none given); a 400 naming it if invalid."""
    if text is None:
        return None
    try:
        return RoomToken.parse(text)
    except TokenError as exc:
        raise InvalidParam(f"{name}: {exc}") from None


async def writer_names(host: HostApi, name: str, token: RoomToken | None) -> dict[int, str]:
    """The instance names of the writers ``token`` (parameter ``name``) lists; a 400 naming the parameter
    when an ID is no instance's (a token of another deployment, or made up)."""
    if token is None or not token.writers:
        return {}
    names = await host.instance_names(i for i, _ in token.writers)
    unknown = [i for i, _ in token.writers if i not in names]
    if unknown:
        raise InvalidParam(f"{name}: invalid room token {str(token)[:40]!r}: no writer has instance ID {unknown[0]}")
    return names


async def live_positions(host: HostApi, name: str, token: RoomToken) -> Positions:
    """Where the live token ``token`` (parameter ``name``) puts each writer of the events stream."""
    return positions_of(token, await writer_names(host, name, token))


async def token_text(host: HostApi, positions: Positions) -> str:
    """The live token of ``positions``: ``s<stream>`` when every writer is at one position, else ``m...``."""
    ids = await host.instance_ids(positions.ahead) if positions.ahead else {}
    return str(live_token(positions, ids))
