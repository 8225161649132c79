"""The plugin's settings: the ``plugins.presence`` section of the configuration file.

::

    plugins:
      presence:
        enabled: true                   # false: no presence at all (nobody reported, PUT refused)
        idle_timeout_ms: 300000         # online -> unavailable after this long without activity
        sync_online_timeout_ms: 30000   # -> offline this long after the user's last sync ended
        stop_syncing_delay_ms: 10000    # a process reports "stopped syncing" after this long
        check_interval_ms: 5000         # how often the writer applies the timeouts

The defaults are the reference's (``IDLE_TIMER``, ``SYNC_ONLINE_TIMEOUT``, ``UPDATE_SYNCING_USERS_MS``
and its 5-second timeout check). Environment overrides: ``FACTSTREAM_PLUGINS__PRESENCE__<KEY>``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PresenceSettings(BaseModel):
    """``plugins.presence``, validated when the host starts: a bad value stops it, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="false: nobody is reported syncing and PUT status is refused (the reference's presence.enabled)",
    )
    idle_timeout_ms: int = Field(default=300_000, ge=100, le=86_400_000, description="online -> unavailable")
    sync_online_timeout_ms: int = Field(default=30_000, ge=100, le=86_400_000, description="not syncing -> offline")
    stop_syncing_delay_ms: int = Field(
        default=10_000, ge=0, le=3_600_000, description="how long after its last /sync a user stops syncing here"
    )
    check_interval_ms: int = Field(default=5_000, ge=50, le=600_000, description="how often timeouts are applied")
    max_status_msg_length: int = Field(default=1_000, ge=1, le=60_000, description="the longest status_msg")
