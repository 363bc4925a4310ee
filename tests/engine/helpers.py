"""Small helpers shared by the engine acceptance tests (pymongo only, no engine internals)."""

from __future__ import annotations

import threading
from typing import Any

from pymongo import MongoClient, monitoring


class CommandRecorder(monitoring.CommandListener):
    """Records the commands a client sends (to count getMore/killCursors, see txnNumber)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_events: list[monitoring.CommandStartedEvent] = []
        self.succeeded_events: list[monitoring.CommandSucceededEvent] = []
        self.failed_events: list[monitoring.CommandFailedEvent] = []

    def started_names(self) -> list[str]:
        with self._lock:
            return [e.command_name for e in self.started_events]

    def count(self, name: str) -> int:
        return self.started_names().count(name)

    def started_commands(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e.command) for e in self.started_events if e.command_name == name]

    def replies(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e.reply) for e in self.succeeded_events if e.command_name == name]

    def clear(self) -> None:
        with self._lock:
            self.started_events.clear()
            self.succeeded_events.clear()
            self.failed_events.clear()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        with self._lock:
            self.started_events.append(event)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        with self._lock:
            self.succeeded_events.append(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        with self._lock:
            self.failed_events.append(event)


def recording_client(uri: str, **kwargs: Any) -> tuple[MongoClient, CommandRecorder]:
    recorder = CommandRecorder()
    return MongoClient(uri, event_listeners=[recorder], **kwargs), recorder
