"""The plugin's settings: the ``plugins.${name}`` section of the configuration file.

::

    plugins:
      ${name}:
        max_value_length: 1000   # env FACTSTREAM_PLUGINS__${name.upper()}__MAX_VALUE_LENGTH
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ${camel}Settings(BaseModel):
    """``plugins.${name}``, validated when the host starts: a bad value stops it, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_value_length: int = Field(default=1000, ge=1, le=60_000, description="the longest value, in characters")
