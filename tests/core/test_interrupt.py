"""Ctrl-C while ``factstream`` imports its modules: one line, exit code 130, no traceback (issue 33).

The console script's entry (``_factstream_entry``) imports factstream inside its ``try``. To land the
SIGINT inside the imports every time, a ``sitecustomize`` on ``PYTHONPATH`` holds the import of
SQLAlchemy (which factstream's package imports first thing) until the test has sent it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from factstream.testing import wait_until

SLOW_IMPORT = """
import sys, time
from pathlib import Path

class SlowSqlalchemy:
    def find_spec(self, name, path=None, target=None):
        if name == "sqlalchemy":
            Path({marker!r}).write_text("importing")
            time.sleep(60)
        return None

sys.meta_path.insert(0, SlowSqlalchemy())
"""


def test_ctrl_c_during_the_imports_exits_130_without_a_traceback(tmp_path: Path) -> None:
    marker = tmp_path / "importing"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_IMPORT.format(marker=str(marker)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    script = Path(sys.executable).parent / "factstream"
    proc = subprocess.Popen([str(script), "--help"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: marker.exists() or proc.poll() is not None, 30, "the import of sqlalchemy")
    assert proc.poll() is None, proc.communicate()

    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)

    assert proc.returncode == 130, stderr
    assert stderr == "interrupted\n", stderr
    assert stdout == ""
