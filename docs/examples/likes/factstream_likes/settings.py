"""The plugin's settings: the ``plugins.likes`` section of the configuration.

::

    plugins:
      likes:
        max_target_length: 200   # env FACTSTREAM_PLUGINS__LIKES__MAX_TARGET_LENGTH
        recent_likes: 50         # env FACTSTREAM_PLUGINS__LIKES__RECENT_LIKES
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LikesSettings(BaseModel):
    """``plugins.likes``, validated when the host starts: a bad value stops it, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_target_length: int = Field(default=200, ge=1, le=1000, description="the longest target, in characters")
    recent_likes: int = Field(default=50, ge=0, le=10_000, description="how many likes GET /likes lists")
