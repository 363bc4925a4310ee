"""The platform's write path as memory uses it: plans executed by the unit of work.

Memory builds every write as a :class:`~accord.platform.plan.Plan` (groups of ops per
collection, artifact classes ``long_term_memory``, ``memory_history`` and ``memory_vector``)
and hands it to the platform's unit of work, which runs it in one transaction with its
hooks (tenancy, outbox, memory vectors; governance's policy and audit when wired), retries
and error translation.
"""

from __future__ import annotations

from accord.platform.artifacts import LONG_TERM_MEMORY as _LTM
from accord.platform.artifacts import MEMORY_HISTORY as _HISTORY
from accord.platform.artifacts import MEMORY_VECTOR as _VECTOR
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.plan import Expect, Group, Op, Plan, PlanContext
from accord.platform.synchronous.catalog import Catalog
from accord.platform.synchronous.unit_of_work import UnitOfWork

LONG_TERM_MEMORY = _LTM.name
MEMORY_HISTORY = _HISTORY.name
MEMORY_VECTOR = _VECTOR.name
COMPONENT = "memory"

__all__ = [
    "COMPONENT",
    "LONG_TERM_MEMORY",
    "MEMORY_HISTORY",
    "MEMORY_VECTOR",
    "AsyncCatalog",
    "AsyncUnitOfWork",
    "Catalog",
    "Expect",
    "Group",
    "Op",
    "Plan",
    "PlanContext",
    "UnitOfWork",
]
