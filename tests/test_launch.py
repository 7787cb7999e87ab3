"""Local jobs (launch/processes.py): ranks started as processes, or forked from the session's
fork server (launch/forkserver.py) when it runs; both behave alike."""

from __future__ import annotations

import os
import sys

import pytest

from bagpipe_cli.launch import forkserver
from bagpipe_cli.launch.processes import RankError, spawn_local

PROGRAM = """
import os, sys
rank = int(os.environ["RANK"])
print(f"line from {rank} of {os.environ['WORLD_SIZE']} argv={sys.argv[1:]}", flush=True)
if rank == int(sys.argv[1]):
    print("Error: rank " + str(rank) + " refuses", file=sys.stderr)
    sys.exit(2)
"""


@pytest.mark.parametrize("forked", [True, False])
def test_a_job_s_lines_exit_codes_and_errors(forked, monkeypatch):
    if not forked:
        monkeypatch.delenv(forkserver.ENV, raising=False)
    elif not os.environ.get(forkserver.ENV):
        pytest.skip("no fork server in this session (BAGPIPE_TEST_FORKSERVER=0)")
    lines: list[str] = []
    spawn_local([sys.executable, "-c", PROGRAM, "-1"], 3, str, 30, lines.append)
    assert lines == ["line from 0 of 3 argv=['-1']\n"]  # rank 0's stdout; the others' dropped
    with pytest.raises(RankError, match="rank 1 refuses") as e:
        spawn_local([sys.executable, "-c", PROGRAM, "1"], 3, str, 30)
    assert e.value.exit_code == 2
