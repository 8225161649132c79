"""The plugin's settings: the ``plugins.events`` section of the configuration.

::

    plugins:
      events:
        max_body_bytes: 1048576          # env FACTSTREAM_PLUGINS__EVENTS__MAX_BODY_BYTES
        censor_redactions_after_days: 7  # env ..._CENSOR_REDACTIONS_AFTER_DAYS; unset: never

The host validates the section when it starts (a bad value stops start-up naming the key).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EventsSettings(BaseModel):
    """``plugins.events``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="the largest request body of the events routes, in bytes (a remote batch of 100 events fits)",
    )
    censor_redactions_after_days: float | None = Field(
        default=None,
        gt=0,
        description=(
            "once a redaction is this many days old, overwrite the stored JSON of its target with the pruned "
            "form (the censor job); unset (the default): stored events are never rewritten"
        ),
    )
