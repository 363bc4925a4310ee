"""The DBOS side of the fleet benchmark (``benchmarks/fleet.py``), run in a process of its
own: ``python -m benchmarks.fleet_dbos RUNS CONCURRENCY DIR``.

The same workload as accord's: RUNS workflows of three steps, each step one DBOS step (the
fake tool, recorded by DBOS) and one business write in a DBOS transaction of a SQLite
datasource, keeping the step's start and end times. DBOS's system database is SQLite too,
both files in DIR (the same disk as accord's engine); the workflows are enqueued on a DBOS
queue with ``worker_concurrency`` CONCURRENCY. Prints one JSON line: the wall time from the
first step's start until every workflow's result was returned, and each step's times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main(runs: int, concurrency: int, directory: Path) -> dict[str, Any]:
    import sqlalchemy as sa
    from dbos import DBOS, SQLAlchemyDatasource

    DBOS(config={"name": "fleet", "system_database_url": f"sqlite:///{directory}/dbos_sys.sqlite",
                 "log_level": "WARNING"})  # fmt: skip
    ds = SQLAlchemyDatasource.create(f"sqlite:///{directory}/dbos_app.sqlite")
    with ds.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS fleet_steps (id TEXT PRIMARY KEY, "
                             "run TEXT, step TEXT, start REAL, end REAL)"))  # fmt: skip

    @DBOS.step()
    def lookup(run: str, step: str) -> str:
        return f"receipt-{run}-{step}"

    @ds.transaction()
    def write(run: str, step: str, start: float) -> None:
        ds.sql_session().execute(
            sa.text("INSERT INTO fleet_steps VALUES (:id, :run, :step, :start, :end)"),
            {"id": f"{run}:{step}", "run": run, "step": step, "start": start, "end": time.time()},
        )

    @DBOS.workflow()
    def fleet_run(run: str) -> list[str]:
        receipts = []
        for step in ("a", "b", "c"):
            start = time.time()
            receipts.append(lookup(run, step))
            write(run, step, start)
        return receipts

    DBOS.launch()
    try:
        queue = DBOS.register_queue("fleet", worker_concurrency=concurrency,
                                    polling_interval_sec=0.05)  # fmt: skip
        handles = [queue.enqueue(fleet_run, f"run-{i}") for i in range(runs)]
        for handle in handles:
            handle.get_result()
        done = time.time()
        with ds.engine.begin() as conn:
            rows = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM fleet_steps"))]
    finally:
        DBOS.destroy()
    first = min(r["start"] for r in rows)
    return {"wall": done - first, "steps": rows}


if __name__ == "__main__":
    out = main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    print(json.dumps(out))
