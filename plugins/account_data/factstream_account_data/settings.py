"""The plugin's settings: the ``plugins.account_data`` section of the configuration.

::

    plugins:
      account_data:
        max_body_bytes: 65536     # env FACTSTREAM_PLUGINS__ACCOUNT_DATA__MAX_BODY_BYTES

The host validates the section when it starts (a bad value stops start-up naming the key); routes
read it with ``host.plugin_settings(AccountDataSettings)``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: The default limit of a ``PUT`` body: 64 KiB.
DEFAULT_MAX_BODY_BYTES = 64 * 1024


class AccountDataSettings(BaseModel):
    """``plugins.account_data``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        ge=1,
        description="the largest PUT body, in bytes (413 beyond; the host's own limit of 1 MiB still applies)",
    )
