"""Run one engine in the foreground until SIGTERM/SIGINT: what ``accord engine start
--foreground`` (and so ``python -m accord.platform.embedded``) does."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from accord.errors import DataDirLockedError, EngineStartError
from accord.platform.embedded.discovery import EXIT_DIR_TAKEN, EXIT_START_FAILED
from accord.platform.embedded.server import EmbeddedServer

# What a parent process reads on the engine's stdout to learn that it listens.
READY_LINE = "accord-engine listening on"
# How often the main thread looks for a stop signal.
STOP_POLL_S = 0.2
# Python's thread switch interval in the engine's process (see serve).
SWITCH_INTERVAL_S = 0.001


def serve(
    dbpath: Path,
    *,
    host: str,
    port: int,
    sync: bool,
    ttl_interval: float,
    transaction_lifetime: float,
    snapshot_history: float = 300.0,
    repair: bool = False,
    enable_test_commands: bool = False,
    max_connections: int | None = None,
    auth: bool = False,
) -> int:
    """Serve ``dbpath`` until a signal stops the engine; returns the process exit code.

    Exit code 2: the engine could not start (port in use, data directory unusable, data
    files damaged); exit code 100 (mongod's for a data directory in use): another engine
    serves ``dbpath``, and a starter that lost the race to start it polls for the winner's
    lock. The reason is printed on stderr as one ``error: ...`` line.
    ``ACCORD_ENGINE_ADMIN_USER`` and ``ACCORD_ENGINE_ADMIN_PASSWORD``, when both are set,
    name a ``root`` user created at start if no user exists yet (read from the
    environment, never the command line, where other users of the machine could see the
    password).
    """
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    admin = admin_from_environment()
    if isinstance(admin, str):
        print(f"error: {admin}", file=sys.stderr)
        return EXIT_START_FAILED
    # A thread that wants Python's interpreter lock waits up to this long for the one
    # holding it (5 ms by default). The loop serving inserts and a read's slice under the
    # engine lock need it back often, beside threads doing a heavy read's work: an insert's
    # p99 beside heavy searches was 208 ms at 5 ms and 110 ms at 1 ms (benchmarks.engine_reads,
    # 20k memories, same hour). Only when the engine has the process to itself.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = EmbeddedServer(
        dbpath,
        host=host,
        port=port,
        sync=sync,
        ttl_interval=ttl_interval,
        transaction_lifetime=transaction_lifetime,
        snapshot_history=snapshot_history,
        repair=repair,
        enable_test_commands=enable_test_commands,
        max_connections=max_connections,
        auth=auth,
        admin_user=admin,
    )

    # The handler only notes the signal; the main thread stops the server. It waits in
    # short slices because a process-directed signal may be delivered to any thread (e.g.
    # one of numpy's OpenBLAS workers): Python then runs the handler in the main thread at
    # its next bytecode, but a main thread blocked in one endless wait never gets there
    # (the old handler, and so the stop, could wait indefinitely: "over 30 s" in tests).
    requested: list[int] = []

    def _note(signum: int, frame: object) -> None:
        requested.append(signum)

    signal.signal(signal.SIGTERM, _note)
    signal.signal(signal.SIGINT, _note)
    try:
        server.start()
    except DataDirLockedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_DIR_TAKEN
    except EngineStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    print(f"{READY_LINE} {server.address} dbpath={server.dbpath}", flush=True)
    while not requested and not server.stopping.wait(STOP_POLL_S):
        pass
    server.stop()
    return 0


ADMIN_USER_ENV = "ACCORD_ENGINE_ADMIN_USER"
ADMIN_PASSWORD_ENV = "ACCORD_ENGINE_ADMIN_PASSWORD"


def admin_from_environment() -> tuple[str, str] | None | str:
    """(user, password) from the environment, None if neither is set, or what is wrong."""
    user, password = os.environ.get(ADMIN_USER_ENV), os.environ.get(ADMIN_PASSWORD_ENV)
    if not user and not password:
        return None
    if not user or not password:
        return (
            f"{ADMIN_USER_ENV} and {ADMIN_PASSWORD_ENV} go together: set both to create "
            "the first admin user, or neither"
        )
    return user, password
