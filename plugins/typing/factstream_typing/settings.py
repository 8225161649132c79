"""The plugin's settings: the ``plugins.typing`` section of the configuration file.

::

    plugins:
      typing:
        default_timeout_ms: 30000   # env FACTSTREAM_PLUGINS__TYPING__DEFAULT_TIMEOUT_MS
        max_timeout_ms: 120000      # env FACTSTREAM_PLUGINS__TYPING__MAX_TIMEOUT_MS

The reference's values: a ``PUT .../typing`` without ``timeout`` types for 30 seconds, and a longer
``timeout`` is cut to 120 seconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TypingSettings(BaseModel):
    """``plugins.typing``, validated when the host starts: a bad value stops it, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_timeout_ms: int = Field(
        default=30_000, ge=1, le=3_600_000, description="how long a user types when the request gives no timeout"
    )
    max_timeout_ms: int = Field(
        default=120_000, ge=1, le=3_600_000, description="the longest timeout a request may give (longer is cut)"
    )

    @model_validator(mode="after")
    def _ordered(self) -> TypingSettings:
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ValueError("default_timeout_ms must be at most max_timeout_ms")
        return self
