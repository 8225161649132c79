"""The bundled ``events`` stream plugin: room events (see docs/plugins/events.md).

Built on factstream's public API only, exactly as a third-party plugin would be.
"""

from __future__ import annotations
