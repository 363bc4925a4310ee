"""Which process holds a lease, and whether it is still alive.

A lease names its holder: host name, process id, the process's start time and a *machine*
id. The machine id says which processes can see each other's pids: on Linux the kernel's
boot id (``/proc/sys/kernel/random/boot_id``) and the pid namespace
(``/proc/self/ns/pid``); two processes with the same machine id share one process table.
Only then may a claimer judge the holder itself: the pid is gone, or is now another
process (its start time differs), so the holder is dead and its lease can be taken over at
once instead of waiting for it to expire. Across machines (another host, another
container's pid namespace) nothing is judged: the lease must expire.

``ACCORD_MACHINE_ID`` overrides the machine id (tests use it to play another host).
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from functools import cache
from typing import Any

MACHINE_ENV = "ACCORD_MACHINE_ID"


@dataclass(frozen=True)
class ProcessId:
    """A process, identified so that a reused pid is not mistaken for it."""

    host: str
    pid: int
    started: str | None  # start time in clock ticks since boot (Linux), None elsewhere
    machine: str | None  # processes with the same machine id share one pid table

    def fields(self) -> dict[str, Any]:
        """The holder fields of a lease document."""
        return {
            "holder": f"{self.host}:{self.pid}",
            "holder_host": self.host,
            "holder_pid": self.pid,
            "holder_started": self.started,
            "holder_machine": self.machine,
        }

    @classmethod
    def of_document(cls, doc: Any) -> ProcessId | None:
        """The holder named by a lease document, or None when it names none (a document
        written by an earlier version, or by hand)."""
        if not isinstance(doc, dict):
            return None
        pid = doc.get("holder_pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        started, machine = doc.get("holder_started"), doc.get("holder_machine")
        return cls(
            host=str(doc.get("holder_host") or ""),
            pid=pid,
            started=started if isinstance(started, str) else None,
            machine=machine if isinstance(machine, str) else None,
        )


@cache
def _boot_and_namespace() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return hashlib.blake2b(f"{boot}|{namespace}".encode(), digest_size=12).hexdigest()


def machine_id() -> str | None:
    """This process's machine id (see the module docstring), or None when unknown."""
    override = os.environ.get(MACHINE_ENV)
    return override if override else _boot_and_namespace()


def _stat(pid: int) -> list[str] | None:
    """Fields 3... of ``/proc/PID/stat`` (state first), or None if unknown/gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may contain spaces
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields if len(fields) > 19 else None


def start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), or None if unknown/gone."""
    fields = _stat(pid)
    return fields[19] if fields is not None else None


def current() -> ProcessId:
    """This process."""
    pid = os.getpid()
    return ProcessId(socket.gethostname(), pid, start_time(pid), machine_id())


def is_dead(holder: ProcessId) -> bool:
    """Whether ``holder`` is certainly dead: it shares this process's pid table and its pid
    is gone or belongs to a process started at another time. False when that cannot be
    told (another machine, no /proc)."""
    mine = machine_id()
    if mine is None or holder.machine != mine or holder.started is None:
        return False
    if holder.pid == os.getpid():
        return start_time(holder.pid) != holder.started
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    fields = _stat(holder.pid)
    if fields is None:
        return False
    # a killed process its parent has not reaped yet is a zombie: dead, pid still taken
    return fields[0] in ("Z", "X") or fields[19] != holder.started
