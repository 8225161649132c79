"""An export interrupted by a signal ends as interrupted, whatever its clean-up raises after (issue 43).

A ``KeyboardInterrupt`` can land in the middle of a py4j call; PySpark's own clean-up then calls the JVM on
that connection and fails (``Py4JNetworkError: Answer from Java side is empty``), which replaced the
interruption: exit 1 and "internal error" instead of ``interrupted`` and 130, seen once in a CI run. Each
case runs in a process of its own, which holds no Spark session that the clean-up could stop.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = """
import os, signal, sys
from factstream.export.interrupt import spark_stopped_on_exit

def clean_up_fails():
    raise RuntimeError("Answer from Java side is empty")

def export(case):
    with spark_stopped_on_exit():
        if case == "signal, then the clean-up fails":
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                clean_up_fails()
        elif case == "the clean-up fails, no signal":
            clean_up_fails()
        elif case == "a signal in the earlier export":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            raise AssertionError(case)

case = sys.argv[1]
if case == "a signal in the earlier export":
    try:
        export(case)
    except KeyboardInterrupt:
        pass
    case = "the clean-up fails, no signal"
try:
    export(case)
except KeyboardInterrupt:
    print("interrupted")
except RuntimeError as exc:
    print(f"failed: {exc}")
"""

CASES = {
    "signal, then the clean-up fails": "interrupted",
    "the clean-up fails, no signal": "failed: Answer from Java side is empty",
    "a signal in the earlier export": "failed: Answer from Java side is empty",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_signal_makes_the_export_interrupted_and_only_that_export(case):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM), case], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == CASES[case], result.stderr
