"""Replication trust: the deployment's shared secret, the TCP handshake that proves it, signed Redis messages.

Without ``replication.secret`` nothing here runs and the links speak the reference's protocol byte for
byte. With it (see docs/security.md):

* **TCP.** The server greets every connection with ``SERVER <deployment>``, ``FS_CHALLENGE <nonce>``
  and a ``PING``. The client's first command must be ``FS_AUTH <instance> <client nonce> <proof>``;
  the server answers ``FS_AUTH_OK <instance> <proof>``. A proof is an HMAC-SHA256, keyed with the
  secret, over the role, the deployment, both nonces and the sender's instance name, so the secret never
  travels, a proof cannot be replayed on another connection (fresh nonces), and neither side can reflect
  the other's proof back (the role is part of it). Until its proof checks out, a server sends a client
  nothing but the greeting, and a client accepts nothing but the greeting, ``PING`` and ``ERROR``.
* **Redis.** Every published message ends in a line ``FS_SIG <instance> <mac>``: the publisher's
  instance name and the first 16 bytes of an HMAC-SHA256 of that name and the message, keyed with a
  key derived from the secret and the channel, in hex. A subscriber drops (and logs) every message
  whose signature is missing or wrong before parsing it, and every RDATA or POSITION line in it that
  is not under the signer's own name.

A shared secret authenticates membership of the deployment, not one instance: a process that knows it
can claim any instance name. What each peer may say once authenticated is checked by the handler (an
instance speaks only for itself, about the streams it is configured to write).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from factstream.config import Settings

PROTOCOL = b"factstream-replication-1"

CHALLENGE = b"FS_CHALLENGE"
AUTH = b"FS_AUTH"
AUTH_OK = b"FS_AUTH_OK"
#: What starts the signature line of a Redis message.
SIGNATURE = b"\nFS_SIG "
#: Hex digits of a Redis message's signature (16 bytes of HMAC-SHA256).
SIGNATURE_HEX = 32

_NONCE = re.compile(rb"[0-9a-f]{32}")
_PROOF = re.compile(rb"[0-9a-f]{64}")


class AuthError(Exception):
    """A peer failed the handshake; the message is safe to send back as ``ERROR``."""


def new_nonce() -> bytes:
    """A fresh random nonce, 32 hex digits."""
    return secrets.token_hex(16).encode("ascii")


class ReplicationSecret:
    """The secret of one deployment's replication links, and everything computed with it."""

    __slots__ = ("_key", "_signing_key", "deployment")

    def __init__(self, secret: str, deployment: str) -> None:
        self._key = secret.encode("utf-8")
        self.deployment = deployment.encode("utf-8")
        # Redis messages are signed with a key of their own, bound to the channel: a message
        # captured on one deployment's channel does not verify on another that shares the secret.
        self._signing_key = hmac.digest(self._key, PROTOCOL + b"\nredis\n" + self.deployment, "sha256")

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplicationSecret | None:
        """The deployment's secret from ``replication.secret``, or None when none is configured."""
        secret = settings.replication.secret
        return cls(secret.get_secret_value(), settings.deployment) if secret is not None else None

    def __repr__(self) -> str:
        return f"ReplicationSecret(deployment={self.deployment.decode()!r}, secret=***)"

    # -- the TCP handshake -------------------------------------------------------------------------

    def proof(self, role: bytes, server_nonce: bytes, client_nonce: bytes, instance: str) -> bytes:
        """What ``role`` (``b"client"`` or ``b"server"``) sends to prove it knows the secret, in hex."""
        message = b"\n".join((PROTOCOL, role, self.deployment, server_nonce, client_nonce, instance.encode("utf-8")))
        return hmac.new(self._key, message, hashlib.sha256).hexdigest().encode("ascii")

    def challenge_line(self, server_nonce: bytes) -> bytes:
        return CHALLENGE + b" " + server_nonce + b"\n"

    def answer_challenge(self, line: bytes, client_nonce: bytes, instance: str) -> tuple[bytes, bytes]:
        """The client's side: ``(server nonce, FS_AUTH line)`` for a received ``FS_CHALLENGE`` line."""
        server_nonce = _field(line, CHALLENGE, 1)[0]
        if not _NONCE.fullmatch(server_nonce):
            raise AuthError("FS_CHALLENGE: the nonce must be 32 lowercase hex digits")
        proof = self.proof(b"client", server_nonce, client_nonce, instance)
        auth = b"%s %s %s %s\n" % (AUTH, instance.encode("utf-8"), client_nonce, proof)
        return server_nonce, auth

    def check_client(self, line: bytes, server_nonce: bytes) -> tuple[str, bytes]:
        """The server's side: ``(instance, client nonce)`` of a valid ``FS_AUTH`` line, else AuthError."""
        instance_raw, client_nonce, proof = _field(line, AUTH, 3)
        instance = _instance(instance_raw)
        if not _NONCE.fullmatch(client_nonce) or not _PROOF.fullmatch(proof):
            raise AuthError("authentication failed")
        if not hmac.compare_digest(proof, self.proof(b"client", server_nonce, client_nonce, instance)):
            raise AuthError("authentication failed")
        return instance, client_nonce

    def accept_line(self, server_nonce: bytes, client_nonce: bytes, instance: str) -> bytes:
        """The server's ``FS_AUTH_OK`` line, proving the secret back to the client."""
        proof = self.proof(b"server", server_nonce, client_nonce, instance)
        return b"%s %s %s\n" % (AUTH_OK, instance.encode("utf-8"), proof)

    def check_server(self, line: bytes, server_nonce: bytes, client_nonce: bytes) -> str:
        """The client's side: the server's instance name from a valid ``FS_AUTH_OK`` line, else AuthError."""
        instance_raw, proof = _field(line, AUTH_OK, 2)
        instance = _instance(instance_raw)
        if not _PROOF.fullmatch(proof) or not hmac.compare_digest(
            proof, self.proof(b"server", server_nonce, client_nonce, instance)
        ):
            raise AuthError("the replication server failed to prove that it knows replication.secret")
        return instance

    # -- Redis messages ----------------------------------------------------------------------------

    def sign(self, message: bytes, sender: bytes) -> bytes:
        """``message`` with its signature line appended: signed by ``sender`` (an instance name)."""
        return message + SIGNATURE + sender + b" " + self._mac(sender, message)

    def open(self, message: bytes) -> tuple[bytes, bytes] | None:
        """``(sender, message without its signature line)``, or ``None`` if it is not signed with this secret."""
        end = message.rfind(SIGNATURE)
        if end < 0:
            return None
        sender, _, mac = message[end + len(SIGNATURE) :].rpartition(b" ")
        body = message[:end]
        if len(mac) != SIGNATURE_HEX or not sender or not hmac.compare_digest(mac, self._mac(sender, body)):
            return None
        return sender, body

    # -- HTTP requests between instances (a kept stream's catch-up) ----------------------------------

    def sign_request(self, instance: str, target: str) -> str:
        """The ``X-Factstream-Replication`` header of a request for ``target`` (path and query) made by
        ``instance``: its name and an HMAC of both. A replayed header reads the same thing again, which
        is all such a request does."""
        return f"{instance} {self._request_mac(instance, target)}"

    def check_request(self, header: str, target: str) -> str | None:
        """The instance that signed ``header`` for ``target``, or ``None`` if it is not signed with this secret."""
        instance, _, mac = header.rpartition(" ")
        if not instance or not hmac.compare_digest(mac, self._request_mac(instance, target)):
            return None
        return instance

    def _request_mac(self, instance: str, target: str) -> str:
        message = b"\n".join((PROTOCOL, b"http", self.deployment, instance.encode("utf-8"), target.encode("utf-8")))
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _mac(self, sender: bytes, message: bytes) -> bytes:
        return hmac.digest(self._signing_key, sender + b"\n" + message, "sha256")[:16].hex().encode("ascii")


def _field(line: bytes, name: bytes, count: int) -> list[bytes]:
    parts = line.rstrip(b"\r\n").split(b" ")
    if parts[0] != name or len(parts) != count + 1:
        raise AuthError(f"{name.decode()}: expected {count} field(s)")
    return parts[1:]


def _instance(raw: bytes) -> str:
    try:
        instance = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthError("authentication failed: the instance name is not UTF-8") from None
    if not instance or not instance.isprintable():
        raise AuthError("authentication failed: bad instance name")
    return instance
