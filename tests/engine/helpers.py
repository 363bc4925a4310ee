"""Small helpers shared by the engine acceptance tests (pymongo only, no engine internals)."""

from __future__ import annotations

import threading
from typing import Any

from pymongo import MongoClient, monitoring


class CommandRecorder(monitoring.CommandListener):
    """Records the commands a client sends and the replies it gets (for getMore/killCursors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started: list[monitoring.CommandStartedEvent] = []
        self.succeeded: list[monitoring.CommandSucceededEvent] = []
        self.failed: list[monitoring.CommandFailedEvent] = []

    def started_names(self) -> list[str]:
        with self._lock:
            return [e.command_name for e in self.started]

    def count(self, name: str) -> int:
        return self.started_names().count(name)

    def started_commands(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e.command) for e in self.started if e.command_name == name]

    def clear(self) -> None:
        with self._lock:
            self.started.clear()
            self.succeeded.clear()
            self.failed.clear()

    def started_event(self, event: monitoring.CommandStartedEvent) -> None:  # noqa: D102
        with self._lock:
            self.started.append(event)

    def succeeded_event(self, event: monitoring.CommandSucceededEvent) -> None:  # noqa: D102
        with self._lock:
            self.succeeded.append(event)

    def failed_event(self, event: monitoring.CommandFailedEvent) -> None:  # noqa: D102
        with self._lock:
            self.failed.append(event)


def recording_client(uri: str, **kwargs: Any) -> tuple[MongoClient, CommandRecorder]:
    recorder = CommandRecorder()
    return MongoClient(uri, event_listeners=[recorder], **kwargs), recorder
