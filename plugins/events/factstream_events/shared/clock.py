"""The clock of the plugin: what ``unsigned.age`` is counted to, and the times writes record.

One function, so that the write wing (``origin_server_ts``, ``received_ts``) and the read wing
(``unsigned.age``) read the same clock, and a test can move it in one place.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Now, in milliseconds since the epoch."""
    return int(time.time() * 1000)
