"""The engine lock's hold statistics: longest hold, per-kind longest, histogram buckets."""

from __future__ import annotations

import pytest

from accord.platform.embedded import lockstats
from accord.platform.embedded.lockstats import LockStats


class FakeClock:
    """Wall and thread-CPU time that the test advances by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(lockstats, "time", fake)
    return fake


def hold(stats: LockStats, clock: FakeClock, what: str, wall_ms: float, cpu_ms: float) -> None:
    clock.wall = clock.cpu = 0.0  # exact differences, no float drift across holds
    token = stats.enter(what)
    clock.wall = wall_ms / 1000
    clock.cpu = cpu_ms / 1000
    stats.exit(token, what)


def test_each_hold_lands_in_the_bucket_of_its_upper_bound(clock: FakeClock) -> None:
    stats = LockStats()
    # Bounds are inclusive: 1 ms is "le1ms", just over it is "le5ms".
    for ms in (0.2, 1.0, 1.001, 5.0, 7.0, 10.0, 49.0, 50.0, 99.0, 100.0, 999.0, 1000.0, 1500.0):
        hold(stats, clock, "find", ms, 0.1)
    report = stats.report()
    assert report["histogram"] == {
        "le1ms": 2, "le5ms": 2, "le10ms": 2, "le50ms": 2, "le100ms": 2, "le1000ms": 2,
        "gt1000ms": 1,
    }  # fmt: skip
    assert report["holds"] == 13
    assert report["maxHoldMillis"] == 1500.0
    assert report["maxHoldBy"] == "find"


def test_longest_wall_and_cpu_holds_are_kept_per_kind(clock: FakeClock) -> None:
    stats = LockStats()
    hold(stats, clock, "insert", 3.0, 2.5)
    hold(stats, clock, "gc", 8.0, 0.5)  # long in wall time: not scheduled, little work
    hold(stats, clock, "insert", 2.0, 1.0)
    hold(stats, clock, "", 1.0, 4.0)
    report = stats.report()
    assert (report["maxHoldBy"], report["maxHoldMillis"]) == ("gc", 8.0)
    assert (report["maxHoldCpuBy"], report["maxHoldCpuMillis"]) == ("", 4.0)
    assert report["maxHoldByKind"] == {
        "gc": {"wallMillis": 8.0, "cpuMillis": 0.5},
        "insert": {"wallMillis": 3.0, "cpuMillis": 2.5},
        "other": {"wallMillis": 1.0, "cpuMillis": 4.0},
    }
    assert report["totalHeldMillis"] == 14.0


def test_a_nested_hold_is_part_of_the_outer_one(clock: FakeClock) -> None:
    stats = LockStats()
    outer = stats.enter("update")
    clock.wall += 0.002
    inner = stats.enter("commit")
    clock.wall += 0.003
    stats.exit(inner, "commit")
    assert stats.report()["holds"] == 0
    stats.exit(outer, "update")
    report = stats.report()
    assert report["holds"] == 1
    assert (report["maxHoldBy"], report["maxHoldMillis"]) == ("update", 5.0)
