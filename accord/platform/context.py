"""Who reads or writes, for whom, and why: the context every operation carries.

Every plan the kernel (the unit of work) runs carries a :class:`WriteContext`, and every
read a :class:`ReadContext`. The hooks (tenancy, policy, audit, outbox, vectors) decide from
them alone, never from who happens to be calling: the same write made by the checkpointer,
the HTTP API or a CLI command is told apart only by its principal and operation.

* ``tenant_id``: whose data; every document carries it.
* ``principal``: who acts. A named service principal for in-process use (``runtime``,
  ``aggregator``), the API key's principal for the HTTP API and MCP, the OS user for the CLI.
  A context without one gets its kernel's default principal (the service that kernel serves).
* ``operation``: what for, dotted (``checkpoint.put``, ``store.put``, ``memory.aggregate``).
* ``run``: the run's lease (run id and fencing number) when the operation belongs to a run.
* ``guard``: the run-registry guard the kernel puts first in the transaction (writes only;
  :class:`accord.platform.runs.ThreadGuard`): the owner guard of a run, the free guard of a
  write that belongs to no run, a takeover. The kernel adds it, so no writer can forget it.
* ``bundle``: the code/prompt/model bundle the run is pinned to (durable execution).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from accord.errors import InvalidInputError

if TYPE_CHECKING:
    from accord.platform.runs import Lease, ThreadGuard

PrincipalKind = Literal["service", "api_key", "user"]

#: The service principals accord's own parts act as (governance names them in policies).
RUNTIME = "runtime"
AGGREGATOR = "aggregator"
MEMORY_API = "memory-api"
AUDITOR = "auditor"
ADMIN = "admin"
SERVICE_ROLES = (RUNTIME, AGGREGATOR, MEMORY_API, AUDITOR, ADMIN)


@dataclass(frozen=True)
class Principal:
    """Who acts.

    ``name`` identifies it (``runtime``, ``key:ops-reader``, ``user:alice``); ``role`` is
    the service role a policy grants privileges to (one of :data:`SERVICE_ROLES` or a
    policy's own); ``kind`` says how it was established; ``tenant_id`` is set when the
    principal is bound to one tenant (an API key); ``scopes`` are what an API key was
    issued for (``read``, ``write``).
    """

    name: str
    role: str
    kind: PrincipalKind = "service"
    tenant_id: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for what, value in (("name", self.name), ("role", self.role)):
            if not isinstance(value, str) or not value or len(value) > 200:
                raise InvalidInputError(
                    f"a principal's {what} must be a non-empty string of at most 200 "
                    f"characters, got {value!r}"
                )

    @classmethod
    def service(cls, role: str) -> Principal:
        """An in-process service principal (``runtime``, ``aggregator``, ...)."""
        return cls(name=role, role=role, kind="service")

    @classmethod
    def api_key(
        cls, key_id: str, *, tenant_id: str, scopes: frozenset[str], role: str = MEMORY_API
    ) -> Principal:
        """The principal of an API key of the HTTP API / MCP server."""
        return cls(
            name=f"key:{key_id}", role=role, kind="api_key", tenant_id=tenant_id, scopes=scopes
        )

    @classmethod
    def os_user(cls, role: str = ADMIN) -> Principal:
        """The operating-system user running a CLI command."""
        try:
            user = getpass.getuser()
        except Exception:  # no passwd entry (a container's arbitrary uid)
            user = f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
        return cls(name=f"user:{user}", role=role, kind="user")

    def describe(self) -> str:
        return self.name if self.name == self.role else f"{self.name} (role {self.role})"


@dataclass(frozen=True)
class WriteContext:
    """The context of a plan (see the module docstring)."""

    tenant_id: str
    thread_id: str | None = None
    principal: Principal | None = None
    operation: str = ""
    run: Lease | None = None
    guard: ThreadGuard | None = None
    bundle: Mapping[str, Any] | None = None

    def with_principal(self, principal: Principal) -> WriteContext:
        return replace(self, principal=principal)


#: The name plans were built with before contexts had principals and runs; the same class.
PlanContext = WriteContext


@dataclass(frozen=True)
class ReadContext:
    """The context of a read: the same who / for whom / why as a write's."""

    tenant_id: str
    thread_id: str | None = None
    principal: Principal | None = None
    operation: str = ""
    run: Lease | None = None
    bundle: Mapping[str, Any] | None = None

    def with_principal(self, principal: Principal) -> ReadContext:
        return replace(self, principal=principal)
