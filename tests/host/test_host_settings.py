"""``host.settings``: what a plugin may read of the core configuration (``factstream.HostSettings``), and
nothing else of it."""

from __future__ import annotations

import factstream


async def test_a_plugin_reads_the_deployment_the_writers_and_the_caches_retention(inbox_cluster):
    host = await inbox_cluster("main", caches={"retention_seconds": 60, "retention_batch_ids": 7})

    settings = host.api.settings

    assert isinstance(settings, factstream.HostSettings)
    assert settings.deployment == host.settings.deployment
    assert settings.writers_for("inbox") == ["main"]
    assert settings.writers_for("a_stream_nobody_configured") == [host.api.main_instance]
    assert (settings.caches.retention_seconds, settings.caches.retention_batch_ids) == (60, 7)


async def test_the_rest_of_the_configuration_and_its_secrets_are_not_handed_to_plugins(inbox_cluster):
    host = await inbox_cluster("main", replication={"secret": "a-secret-of-16-chars"})

    settings = host.api.settings

    assert host.settings.replication.secret is not None
    for section in ("replication", "http", "database", "redis", "instance_map", "stream_writers", "plugins"):
        assert not hasattr(settings, section), section
