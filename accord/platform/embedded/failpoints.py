"""Fail points: mongod's ``configureFailPoint`` test command, for the faults drivers test.

Only served when the engine runs with ``--enable-test-commands`` (as mongod's
``enableTestCommands``). Two fail points exist, the ones drivers' specs and accord's own
tests use:

- ``failCommand``: for the next commands named in ``data.failCommands`` (optionally only
  from clients whose handshake said ``appName``), block the connection for
  ``blockTimeMS``, close it without a reply (``closeConnection``), answer an error
  (``errorCode``, with ``errorLabels`` replacing the labels the server would add), or run
  the command and attach a ``writeConcernError`` to its reply.
- ``onPrimaryTransactionalWrite``: on a retryable write, close the connection after the
  write committed (so the client never sees the reply), or, with
  ``failBeforeCommitExceptionCode``, fail it before it commits.

Modes are mongod's: ``"alwaysOn"``, ``"off"``, ``{times: n}`` (the next n matches),
``{skip: n}`` (every match after the first n). Matching and counting run under this
module's own lock, never the engine's, so a blocked connection holds nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from accord.platform.embedded.errors import Code, EngineError

Doc = dict[str, Any]

FAIL_COMMAND = "failCommand"
ON_PRIMARY_TRANSACTIONAL_WRITE = "onPrimaryTransactionalWrite"
KNOWN = (FAIL_COMMAND, ON_PRIMARY_TRANSACTIONAL_WRITE)
FAIL_COMMAND_MESSAGE = "Failing command via 'failCommand' failpoint"
_FAIL_COMMAND_FIELDS = {
    "failCommands", "errorCode", "errorLabels", "closeConnection", "blockConnection",
    "blockTimeMS", "writeConcernError", "appName", "failInternalCommands", "namespace",
    "errorExtraInfo",
}  # fmt: skip
_TRANSACTIONAL_WRITE_FIELDS = {"closeConnection", "failBeforeCommitExceptionCode"}


class CloseConnection(Exception):  # noqa: N818 (an instruction to the server, not an error)
    """Close the client's connection without replying (a fail point asked for it)."""


@dataclass(frozen=True)
class Action:
    """What one firing of a fail point does to the command it caught."""

    block_ms: int = 0
    close_connection: bool = False
    error_code: int | None = None
    # None: the server computes the labels; a tuple (even empty) replaces them.
    error_labels: tuple[str, ...] | None = None
    write_concern_error: Doc | None = None
    fail_before_commit_code: int | None = None

    def error_reply(self) -> Doc:
        assert self.error_code is not None
        return EngineError(self.error_code, FAIL_COMMAND_MESSAGE).to_reply()


@dataclass
class _FailPoint:
    name: str
    mode: str = "off"  # "off" | "alwaysOn" | "times" | "skip"
    remaining: int = 0  # times: firings left; skip: matches still to let through
    data: Doc = field(default_factory=dict)
    entered: int = 0  # how often it fired since it was configured (mongod's "count")


def _count(mode: Doc, key: str) -> int:
    value = mode[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise EngineError(
            Code.BadValue, f"'{key}' in the fail point mode must be a non-negative integer"
        )
    return int(value)


class FailPoints:
    """The engine's fail points; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points = {name: _FailPoint(name) for name in KNOWN}
        # Cheap check for the common case: nothing armed, nothing to match.
        self.armed = False

    def configure(self, cmd: Doc) -> Doc:
        """Run ``configureFailPoint``; the reply has the previous ``count`` as mongod's does."""
        name = cmd.get("configureFailPoint")
        if name not in self._points:
            raise EngineError(
                Code.FailPointSetFailed,
                f"Cannot find failpoint: {name}; the embedded engine knows {', '.join(KNOWN)}",
            )
        mode_spec = cmd.get("mode")
        if mode_spec in ("off", "alwaysOn"):
            mode, remaining = str(mode_spec), 0
        elif isinstance(mode_spec, dict) and len(mode_spec) == 1 and "times" in mode_spec:
            mode, remaining = "times", _count(mode_spec, "times")
        elif isinstance(mode_spec, dict) and len(mode_spec) == 1 and "skip" in mode_spec:
            mode, remaining = "skip", _count(mode_spec, "skip")
        else:
            raise EngineError(
                Code.FailPointSetFailed,
                "mode must be 'off', 'alwaysOn', {times: n} or {skip: n}; "
                f"'activationProbability' is not supported: {mode_spec!r}",
            )
        data = cmd.get("data") or {}
        if not isinstance(data, dict):
            raise EngineError(Code.TypeMismatch, "the fail point's 'data' must be an object")
        if mode != "off":
            _check_data(name, data)
        with self._lock:
            point = self._points[name]
            count = point.entered
            point.mode, point.remaining, point.data, point.entered = mode, remaining, data, 0
            if mode == "times" and remaining == 0:
                point.mode = "off"
            self.armed = any(p.mode != "off" for p in self._points.values())
        return {"count": count, "ok": 1.0}

    def on_command(self, command: str, app_name: str | None) -> Action | None:
        """The ``failCommand`` action for this command, if the fail point fires for it."""
        if not self.armed:
            return None
        with self._lock:
            point = self._points[FAIL_COMMAND]
            data = point.data
            if point.mode == "off" or command not in data.get("failCommands", ()):
                return None
            if "appName" in data and data["appName"] != app_name:
                return None
            if not self._fire(point):
                return None
            labels = data.get("errorLabels")
            return Action(
                block_ms=int(data.get("blockTimeMS", 0)) if data.get("blockConnection") else 0,
                close_connection=bool(data.get("closeConnection")),
                error_code=int(data["errorCode"]) if "errorCode" in data else None,
                error_labels=tuple(labels) if labels is not None else None,
                write_concern_error=dict(data["writeConcernError"])
                if "writeConcernError" in data
                else None,
            )

    def on_transactional_write(self, statements: int = 1) -> Action | None:
        """The ``onPrimaryTransactionalWrite`` action for a retryable write of
        ``statements`` documents, if it fires for one of them (mongod evaluates it per
        statement, so ``{skip: n}`` counts documents)."""
        if not self.armed:
            return None
        with self._lock:
            point = self._points[ON_PRIMARY_TRANSACTIONAL_WRITE]
            for _ in range(max(1, statements)):
                if point.mode == "off":
                    return None
                if self._fire(point):
                    break
            else:
                return None
            data = point.data
            code = data.get("failBeforeCommitExceptionCode")
            return Action(
                close_connection=bool(data.get("closeConnection", True)),
                fail_before_commit_code=int(code) if code is not None else None,
            )

    def _fire(self, point: _FailPoint) -> bool:
        if point.mode == "skip":
            if point.remaining > 0:
                point.remaining -= 1
                return False
        elif point.mode == "times":
            point.remaining -= 1
            if point.remaining <= 0:
                point.mode = "off"
                self.armed = any(p.mode != "off" for p in self._points.values())
        point.entered += 1
        return True


def _check_data(name: str, data: Doc) -> None:
    allowed = _FAIL_COMMAND_FIELDS if name == FAIL_COMMAND else _TRANSACTIONAL_WRITE_FIELDS
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise EngineError(
            Code.FailPointSetFailed,
            f"{name} does not support {', '.join(unknown)} in the embedded engine",
        )
    if name != FAIL_COMMAND:
        code = data.get("failBeforeCommitExceptionCode")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int | float)):
            raise EngineError(Code.TypeMismatch, "failBeforeCommitExceptionCode must be a number")
        return
    commands = data.get("failCommands")
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise EngineError(
            Code.FailPointSetFailed, "failCommand needs 'failCommands', an array of command names"
        )
    code = data.get("errorCode")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int | float)):
        raise EngineError(Code.TypeMismatch, "errorCode must be a number")
    labels = data.get("errorLabels")
    if labels is not None and (
        not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
    ):
        raise EngineError(Code.TypeMismatch, "errorLabels must be an array of strings")
    wce = data.get("writeConcernError")
    if wce is not None and not isinstance(wce, dict):
        raise EngineError(Code.TypeMismatch, "writeConcernError must be an object")
    block = data.get("blockTimeMS", 0)
    if isinstance(block, bool) or not isinstance(block, int | float) or block < 0:
        raise EngineError(Code.TypeMismatch, "blockTimeMS must be a non-negative number")
    if data.get("blockConnection") and "blockTimeMS" not in data:
        raise EngineError(Code.FailPointSetFailed, "blockConnection needs blockTimeMS")
