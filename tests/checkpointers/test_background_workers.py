"""The sync saver's background-save workers (``bridges.in_background`` for plain
functions): reused threads, but every job still gets a thread at once."""

from __future__ import annotations

import contextvars
import threading
import time

from accord.checkpointers import bridges

_MARK: contextvars.ContextVar[str] = contextvars.ContextVar("_MARK", default="unset")


def test_a_blocked_job_does_not_hold_up_the_next_one() -> None:
    # a save waiting on another (a put waiting for task writes) must not starve it
    first_may_end = threading.Event()
    first_ended = threading.Event()

    def first() -> None:
        first_may_end.wait(10)
        first_ended.set()

    bridges.in_background(first)
    bridges.in_background(first_may_end.set)
    assert first_ended.wait(10), "the second job never ran while the first was blocked"


def test_workers_are_reused() -> None:
    workers = bridges._Workers()  # its own pool: other tests' saves do not take its worker
    done = threading.Event()
    seen: list[int] = []

    def record() -> None:
        seen.append(threading.get_ident())
        done.set()

    for _ in range(3):
        done.clear()
        workers.submit(record, ())
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while workers._idle != 1:  # the worker is back to waiting (however late it is)
            assert time.monotonic() < deadline, "the worker never went back to waiting"
            time.sleep(0.005)
    assert len(set(seen)) == 1, f"expected one reused worker thread, got {len(set(seen))}"


def test_each_job_runs_in_a_fresh_context() -> None:
    done = threading.Event()
    seen: list[str] = []

    def set_mark() -> None:
        _MARK.set("leaked")
        done.set()

    def read_mark() -> None:
        seen.append(_MARK.get())
        done.set()

    bridges.in_background(set_mark)
    assert done.wait(10)
    done.clear()
    time.sleep(0.05)
    bridges.in_background(read_mark)
    assert done.wait(10)
    assert seen == ["unset"]


def test_a_raising_job_leaves_the_worker_serving() -> None:
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    bridges.in_background(boom)
    time.sleep(0.05)
    bridges.in_background(done.set)
    assert done.wait(10)
