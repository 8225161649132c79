"""TCP replication over TLS (``replication.tls``), with a certificate made by ``openssl`` for 127.0.0.1."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from factstream.config import load_config
from factstream.errors import ConfigError
from factstream.replication.transport import tls_context
from factstream.testing import until
from tests.replication.test_replication import append_notes, received
from tests.replication.test_trust import SECRET

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def tls(cert: Path, key: Path, ca: Path, **more: str) -> dict[str, object]:
    return {"tls": True, "tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca), **more}


async def test_replication_over_tls_with_a_secret_delivers_every_fact(host_cluster, tmp_path):
    cert, key = make_certificate(tmp_path, "main")
    config = tls(cert, key, cert, secret=SECRET)
    main = await host_cluster("main", replication=config)
    worker = await host_cluster("worker1", replication=config)
    await host_cluster.following(worker, "notes")

    ids = await append_notes(main, 30)

    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    [conn] = main.transport.endpoint.connections
    assert conn.writer.get_extra_info("ssl_object") is not None


async def test_a_plain_client_learns_nothing_from_a_tls_server(host_cluster, tmp_path):
    cert, key = make_certificate(tmp_path, "main")
    main = await host_cluster("main", replication=tls(cert, key, cert))
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    writer.write(b"NAME x\nREPLICATE \n")
    await writer.drain()
    with pytest.raises((ConnectionError, TimeoutError)):
        async with asyncio.timeout(2):
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed")
            assert b"SERVER" not in data and b"POSITION" not in data
            raise ConnectionError("only TLS records")
    writer.close()


async def test_a_worker_that_does_not_trust_the_certificate_never_connects(host_cluster, tmp_path, caplog):
    cert, key = make_certificate(tmp_path, "main")
    other, _ = make_certificate(tmp_path, "other")
    main = await host_cluster("main", replication=tls(cert, key, cert))
    await host_cluster("worker1", replication=tls(cert, key, other))
    await asyncio.sleep(0.5)

    await append_notes(main, 3)

    await asyncio.sleep(0.5)
    assert received("worker1") == []
    # A WARNING (not the reconnection's usual INFO): the error is in its key=value fields.
    warnings = [
        r for r in caplog.records if r.levelname == "WARNING" and r.getMessage() == "replication reconnect failed"
    ]
    assert any("CERTIFICATE_VERIFY_FAILED" in r.fields["error"] for r in warnings), caplog.text  # type: ignore[attr-defined]


def test_tls_without_a_certificate_on_the_main_instance_is_a_configuration_error(tmp_path):
    settings = load_config(environ={}, replication={"tls": True})
    with pytest.raises(ConfigError, match=r"needs replication\.tls_cert and tls_key"):
        tls_context(settings, server=True)
    missing = load_config(environ={}, replication=tls(tmp_path / "no.pem", tmp_path / "no.key", tmp_path / "no.pem"))
    with pytest.raises(ConfigError, match="cannot load the certificate, key or CA file"):
        tls_context(missing, server=True)
    assert tls_context(load_config(environ={}), server=True) is None


def test_tls_files_are_relative_to_the_config_file(tmp_path):
    path = tmp_path / "factstream.yaml"
    path.write_text("replication:\n  tls: true\n  tls_cert: certs/main.pem\n  tls_key: certs/main.key\n")

    settings = load_config(path, environ={})

    assert settings.replication.tls_cert == tmp_path / "certs" / "main.pem"
    assert settings.replication.tls_key == tmp_path / "certs" / "main.key"
