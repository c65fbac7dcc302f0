"""A Python process that abandoned storage calls (storage not answering) still ends: at
exit it waits a few seconds for them, then exits with status 75 and says why."""

from __future__ import annotations

import pytest

from fenwicks import _deadline
from tests.conftest import run_process

_ABANDONS = """
import time
from fenwicks import _deadline
_deadline.EXIT_WAIT_SECS = 1
try:
    _deadline.run(time.sleep, {seconds}, what="checkpoint save", path="gs://bucket/run")
except _deadline.StorageTimeoutError as err:
    print("abandoned:", err)
print("program ends", flush=True)
"""


@pytest.mark.parametrize("seconds, status", [(60, _deadline.EXIT_STATUS), (1.5, 0)],
                         ids=["still-running", "finishes-in-the-wait"])
def test_abandoned_storage_calls_end_the_process_in_bounded_time(seconds, status):
    proc = run_process(["-c", _ABANDONS.format(seconds=seconds)], check=False, fresh=True,
                       env={_deadline.DEADLINE_ENV: "1"}, timeout=60)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert "abandoned: checkpoint save of gs://bucket/run" in proc.stdout
    assert "program ends" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if "exiting with status" in line]
    if status:
        assert len(said) == 1 and "(checkpoint save)" in said[0] and \
            "Checkpoints saved before are complete" in said[0], proc.stderr[-2000:]
        assert proc.seconds < 30  # not the 60 s the call would take
    else:
        assert said == []


def test_a_process_without_storage_calls_exits_normally():
    proc = run_process(["-c", "import fenwicks; print('done')"], fresh=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "done"
    assert "exiting with status" not in proc.stderr
