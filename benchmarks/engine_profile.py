"""Engine CPU per command while a LangGraph checkpointer runs the chat benchmark's graph.

Not part of ``make bench``: a tool for engine work. It starts one engine process with
the engine's connection threads instrumented (CPU time per command, by command name,
parse + dispatch + reply encoding; optionally a cProfile of that CPU), drives it with one
saver for ``--turns`` turns of ``benchmarks.checkpointer``'s graph (the first turns
warm up and are not counted), then prints the engine CPU per invoke and per command::

    .venv/bin/python -m benchmarks.engine_profile --saver accord --turns 100 [--profile out.prof]

``--saver`` is ``accord``, ``async`` (AsyncAccordSaver) or ``mongodb`` (MongoDBSaver);
``--audit MODE`` (``accord`` only) runs an ``Accord`` root's saver with that audit mode on
``benchmarks.audit``'s ``chat`` workload (one business write per turn), to compare modes.
Figures are thread CPU time (``time.thread_time``) of the threads serving the saver's
connections, so waiting for the lock or the client costs nothing; the housekeeping
thread is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

WARMUP = 10


# --- the engine side (runs in the engine process) ------------------------------------------


def _serve(dbpath: str, profile_path: str | None, report_path: str, sample: bool) -> None:
    import cProfile

    from accord.platform.embedded import server as srv
    from accord.platform.embedded import wire

    cpu: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    enabled = threading.Event()
    local = threading.local()
    profiles: list[cProfile.Profile] = []
    plock = threading.Lock()

    def profiler() -> cProfile.Profile | None:
        if profile_path is None:
            return None
        p = getattr(local, "p", None)
        if p is None:
            p = local.p = cProfile.Profile(timer=time.thread_time)
            with plock:
                profiles.append(p)
        return p

    active: set[int] = set()
    samples: Counter[tuple[str, ...]] = Counter()

    def sampler() -> None:
        # Statistical profile: stacks of the threads inside a command, every ~0.5 ms
        # (cProfile's per-call overhead distorts Python-heavy code several times over).
        me = threading.get_ident()
        while True:
            time.sleep(0.0005)
            if not enabled.is_set():
                continue
            frames = sys._current_frames()
            for tid in list(active):
                if tid == me:
                    continue
                f = frames.get(tid)
                stack = []
                while f is not None:
                    code = f.f_code
                    stack.append(
                        f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"
                    )
                    f = f.f_back
                samples[tuple(stack)] += 1

    if sample:
        sys.setswitchinterval(0.0005)
        threading.Thread(target=sampler, daemon=True).start()

    def timed(name_of: Any, fn: Any, count: bool) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not enabled.is_set():
                return fn(*args, **kwargs)
            p = profiler()
            t0 = time.thread_time()
            tid = threading.get_ident()
            active.add(tid)
            if p is not None:
                p.enable()
            try:
                result = fn(*args, **kwargs)
            finally:
                if p is not None:
                    p.disable()
                active.discard(tid)
                spent = time.thread_time() - t0
            name = name_of(args, result)
            cpu[name] += spent
            if count:
                calls[name] += 1
            return result

        return wrapper

    def cmd_name(command: dict[str, Any]) -> str:
        name = next(iter(command), "")
        return name

    parse = wire.parse_message
    encode = wire.encode_reply
    begin = (
        srv.EmbeddedServer.begin
    )  # the request's command, up to its commit (not the wait for fsync)
    wire.parse_message = timed(lambda a, r: cmd_name(r.command), parse, False)  # type: ignore[assignment]
    wire.encode_reply = timed(lambda a, r: cmd_name(a[0].command), encode, False)  # type: ignore[assignment]
    srv.EmbeddedServer.begin = timed(lambda a, r: cmd_name(a[1].command), begin, True)  # type: ignore[method-assign]

    # Parts of the commands, timed on their own (thread CPU; shown as "  part" rows).
    from accord.platform.embedded import engine as eng
    from accord.platform.embedded import group_commit, storage

    def part(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not enabled.is_set():
                return fn(*args, **kwargs)
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu["  " + label] += time.thread_time() - t0
                calls["  " + label] += 1

        setattr(owner, attr, wrapper)

    part(storage.Storage, "apply", "storage.apply (SQLite write)")
    part(eng.Engine, "commit", "engine.commit (install)")
    part(eng.Engine, "finalize", "engine.finalize")
    part(group_commit.GroupCommitter, "wait", "group_commit.wait (incl. SQLite)")

    server = srv.EmbeddedServer(Path(dbpath), port=0, sync=False).start()

    def start(signum: int, frame: object) -> None:
        cpu.clear()
        calls.clear()
        enabled.set()

    def stop(signum: int, frame: object) -> None:
        enabled.clear()
        Path(report_path).write_text(
            json.dumps(
                {"cpu": cpu, "calls": calls, "samples": [[list(k), v] for k, v in samples.items()]}
            )
        )
        if profile_path is not None:
            import pstats

            with plock:
                stats = pstats.Stats(profiles[0]) if profiles else None
                for p in profiles[1:]:
                    stats.add(p)  # type: ignore[union-attr]
            if stats is not None:
                stats.dump_stats(profile_path)
        server.stopping.set()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    print(f"port {server.port}", flush=True)
    server.stopping.wait()
    server.stop()


# --- the driver -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--saver", choices=("accord", "async", "mongodb"), default="accord")
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--profile", help="write a cProfile (engine connection threads) here")
    ap.add_argument(
        "--audit",
        choices=("off", "metadata", "full", "policy"),
        help="accord only: an Accord root's saver with this audit mode",
    )
    ap.add_argument("--top", type=int, default=40, help="functions to print from the profile")
    ap.add_argument("--sample", action="store_true", help="print a statistical profile")
    args = ap.parse_args()

    from pymongo import AsyncMongoClient, MongoClient

    from benchmarks.checkpointer import THREAD, build_graph, human

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.engine_profile", "--serve", tmp, report,
             args.profile or "", "1" if args.sample else "0"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        port = int(line.split()[1])
        uri = f"mongodb://127.0.0.1:{port}/?replicaSet=accord"
        loop: asyncio.AbstractEventLoop | None = None
        try:
            if args.saver == "async":
                from accord.checkpointers import AsyncAccordSaver

                loop = asyncio.new_event_loop()
                aclient: AsyncMongoClient[Any] = AsyncMongoClient(uri)
                saver: Any = AsyncAccordSaver(aclient, db_name="prof")
                loop.run_until_complete(saver.setup())
                graph = build_graph().compile(checkpointer=saver)

                def invoke(n: int) -> None:
                    assert loop is not None
                    loop.run_until_complete(graph.ainvoke(human(n), THREAD))
            else:
                client: MongoClient[Any] = MongoClient(uri)
                if args.saver == "accord" and args.audit:
                    from accord.runtime import Accord

                    saver = Accord(client=client, db_name="prof", audit=args.audit).checkpointer()
                elif args.saver == "accord":
                    from accord.checkpointers import AccordSaver

                    saver = AccordSaver(client, db_name="prof")
                    saver.setup()
                else:
                    from langgraph.checkpoint.mongodb import MongoDBSaver

                    saver = MongoDBSaver(client, db_name="prof")
                if args.audit:
                    from accord.checkpointers import business
                    from benchmarks.checkpointer import order

                    # benchmarks.audit's `chat` workload: one business write per turn
                    chat = build_graph(lambda n: business.insert_one("orders", order(n)))
                    graph = chat.compile(checkpointer=saver)
                else:
                    graph = build_graph().compile(checkpointer=saver)

                def invoke(n: int) -> None:
                    graph.invoke(human(n), THREAD)

            for n in range(1, WARMUP + 1):
                invoke(n)
            time.sleep(0.3)  # let the async saver's background commits finish
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            t0 = time.perf_counter()
            for n in range(WARMUP + 1, WARMUP + args.turns + 1):
                invoke(n)
            elapsed = time.perf_counter() - t0
            time.sleep(0.3)
            proc.send_signal(signal.SIGUSR2)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        data = json.loads(Path(report).read_text())

    cpu, calls = Counter(data["cpu"]), Counter(data["calls"])
    turns = args.turns
    total = sum(v for k, v in cpu.items() if not k.startswith("  "))
    load = os.getloadavg()[0]
    print(
        f"saver {args.saver}: {turns} turns in {elapsed:.1f} s, load average {load:.2f}; "
        f"engine CPU {total / turns * 1000:.2f} ms per invoke"
    )
    print(f"{'command':<20} {'per invoke':>10} {'ms each':>8} {'ms/invoke':>9}")
    for name, spent in cpu.most_common():
        n = calls[name]
        each = spent / n * 1000 if n else float("nan")
        print(f"{name:<20} {n / turns:>10.2f} {each:>8.3f} {spent / turns * 1000:>9.3f}")
    if args.sample:
        own: Counter[str] = Counter()
        cum: Counter[str] = Counter()
        n_samples = 0
        blocked = 0
        for stack, n in data["samples"]:
            # Not CPU: a held awaitable hello, a wait on a lock or condition, SQLite's
            # write (timed above as storage.apply).
            if any(":hello" in f for f in stack) or stack[0].startswith(
                ("threading.py", "storage.py:186:apply", "group_commit.py:113:wait")
            ):
                blocked += n
                continue
            n_samples += n
            own[stack[0]] += n
            for fn in set(stack):
                cum[fn] += n
        print(f"\n{n_samples} samples ({blocked} waiting ones left out); self %:")
        for fn, n in own.most_common(args.top):
            print(f"{100 * n / n_samples:6.1f}  {fn}")
        print("\ncumulative %:")
        for fn, n in cum.most_common(args.top * 2):
            print(f"{100 * n / n_samples:6.1f}  {fn}")
    if args.profile:
        import pstats

        stats = pstats.Stats(args.profile)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[4] or None, sys.argv[3], sys.argv[5] == "1")
    else:
        main()
