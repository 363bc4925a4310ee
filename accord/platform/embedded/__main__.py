"""Run the embedded engine in the foreground: ``python -m accord.platform.embedded``.

This is what ``accord engine start`` and ``accord.platform.connect()`` spawn.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from accord.errors import EngineStartError
from accord.platform.embedded.server import EmbeddedServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accord.platform.embedded", description=__doc__)
    parser.add_argument("--dbpath", required=True, help="data directory (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=27017, help="TCP port; 0 picks a free one")
    parser.add_argument("--no-sync", action="store_true", help="do not fsync commits (tests only)")
    parser.add_argument(
        "--ttl-interval", type=float, default=60.0, help="seconds between TTL passes"
    )
    parser.add_argument(
        "--transaction-lifetime",
        type=float,
        default=60.0,
        help="seconds after which an open transaction is aborted (mongod: 60)",
    )
    parser.add_argument(
        "--snapshot-history-window",
        type=float,
        default=300.0,
        help="seconds of history kept for snapshot reads at a past cluster time "
        "(mongod's minSnapshotHistoryWindowInSeconds, default 300)",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="start even if the data files show that acknowledged commits were lost "
        "(an emptied database file, a missing or truncated journal after a crash)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    if args.ttl_interval <= 0 or args.transaction_lifetime <= 0:
        parser.error("--ttl-interval and --transaction-lifetime must be positive")
    if args.snapshot_history_window < 0:
        parser.error("--snapshot-history-window must not be negative")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    server = EmbeddedServer(
        args.dbpath,
        host=args.host,
        port=args.port,
        sync=not args.no_sync,
        ttl_interval=args.ttl_interval,
        transaction_lifetime=args.transaction_lifetime,
        snapshot_history=args.snapshot_history_window,
        repair=args.repair,
    )

    def _stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.start()
    except EngineStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The parent reads this line to learn the port.
    print(f"accord-engine listening on {server.address} dbpath={server.dbpath}", flush=True)
    server.stopping.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
