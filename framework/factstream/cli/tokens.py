"""``factstream tokens``: create, list and revoke the HTTP API's bearer tokens of the ``access_tokens``
table (the work is :mod:`factstream.tokens`'s)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from factstream.cli import session
from factstream.cli.session import err, out
from factstream.errors import FactstreamError

tokens_app = typer.Typer(
    help="Bearer tokens of the HTTP API in the access_tokens table (stored as SHA-256 hashes).", no_args_is_help=True
)


def _token_store() -> Any:
    from factstream.tokens import TokenStore

    return TokenStore(session.database())


def _token_line(info: Any) -> str:
    return f"{info.id} ({info.kind} token of {info.user}, created {info.created_at:%Y-%m-%d %H:%M:%S %Z})"


@tokens_app.command("create")
def tokens_create(
    user: Annotated[str, typer.Argument(help="The user requests with the token act as, e.g. @alice:example.org.")],
    write: Annotated[bool, typer.Option("--write", help="A writer token: may call write routes too.")] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", metavar="TEXT", help="Store this token instead of a new random one.", show_default=False
        ),
    ] = None,
) -> None:
    """Issue a token for USER and print it once on stdout (only its hash is stored).

    T=$(factstream tokens create @alice:example.org) keeps it in a shell variable.
    """
    if token is not None and token in session.state.settings.http.tokens:
        raise FactstreamError("that token is already in the config file (http.tokens); choose another")
    secret, info = _token_store().create(user, can_write=write, token=token)
    print(secret)
    err.print(
        f"created {_token_line(info)}; the token is shown only now and cannot be shown again",
        highlight=False,
        soft_wrap=True,
    )


@tokens_app.command("list")
def tokens_list(
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Only this user's tokens.", show_default=False)
    ] = None,
) -> None:
    """List the table's tokens: id, user, kind and creation time; never the tokens themselves.

    Tokens in the config file (http.tokens) are not listed.
    """
    rows = _token_store().all(user)
    if not rows:
        err.print(f"no tokens{f' of {user}' if user else ''} in the access_tokens table", highlight=False)
        return
    table = Table(title="access tokens")
    for col in ("id", "user", "kind", "created"):
        table.add_column(col, no_wrap=True)
    for info in rows:
        table.add_row(info.id, info.user, info.kind, f"{info.created_at:%Y-%m-%d %H:%M:%S %Z}")
    out.print(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token: Annotated[
        str | None,
        typer.Argument(
            metavar="ID|TOKEN", help="The token's id (from `tokens list`) or the token itself.", show_default=False
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Revoke every token of this user.", show_default=False)
    ] = None,
) -> None:
    """Revoke one token (by id or value) or all of a user's (--user). Hosts stop accepting it within
    http.token_cache_seconds."""
    if (token is None) == (user is None):
        raise FactstreamError("`factstream tokens revoke` needs a token id (or the token) or --user USER, not both")
    store = _token_store()
    revoked = [store.revoke(token)] if token is not None else store.revoke_user(user or "")
    if not revoked:
        raise FactstreamError(f"user {user} has no tokens in the access_tokens table")
    for info in revoked:
        print(f"revoked {_token_line(info)}")
