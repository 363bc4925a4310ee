"""`make demo` runs end to end and shows what it claims."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accord.platform import stop_engine


@pytest.mark.slow
def test_demo_runs_and_resumes_the_killed_agent_exactly_once(tmp_path: Path) -> None:
    # 80 columns, as a terminal (or a pipe) has by default: no message may be cut
    env = dict(os.environ, ACCORD_DATA_DIR=str(tmp_path / "demo"), COLUMNS="80")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "accord.demo"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    finally:
        if not os.environ.get("MONGODB_URI"):
            stop_engine(tmp_path / "demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "WriteConflict" in out and "total balance is still 150" in out
    assert "SIGKILL the worker" in out
    assert "order lines: 5 (each exactly once: True)" in out
    assert "messages in order: ['human-1', 'ai-1', 'ai-2', 'ai-3', 'ai-4', 'ai-5']" in out
    # long-term memory: the user's preference, derived through the outbox, with provenance
    assert "dead-lettered: 0" in out
    assert (
        "preference ('memories',): 'User prefers deliveries on Saturday mornings'" in out
        and "from thread order-42, messages ['human-1']" in out
    )
    assert "through the LangGraph store: [{'content': 'User prefers deliveries" in out
    assert "a second pass finds nothing left to do (0 events)" in out
    assert "with a lease (2 s in this demo)" in out  # why the resumed worker may wait
    # whole lines at 80 columns (the committed step depends on when the kill lands)
    assert re.search(
        r"\n  total: \$41\.25; the resumed run continued after the last committed step "
        r"\(\d\) instead of starting over\n",
        out,
    ), out
    assert (
        "accounts: [{'_id': 'alice', 'balance': 70}, {'_id': 'bob', 'balance': 80}]  "
        "ledger entries: 1\n" in out
    )
