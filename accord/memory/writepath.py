"""The platform's write path as memory uses it: plans executed by the unit of work.

Memory builds every write as a :class:`Plan` (groups of ops per collection, artifact class
``long_term_memory`` / ``memory_history``) and hands it to the platform's unit of work,
which runs it in one transaction with governance's hooks. Until the platform's write path
(``accord.platform.plan`` and the units of work, see PLATFORM_API) is on main, the same
names come from :mod:`accord.memory._interim_platform`, a minimal stand-in with the same
shapes; nothing else in memory knows which one it got.
"""

from __future__ import annotations

try:
    from accord.platform.asynchronous.unit_of_work import (  # type: ignore[import-not-found]
        AsyncUnitOfWork,
    )
    from accord.platform.plan import (  # type: ignore[import-not-found]
        Counts,
        Expect,
        Group,
        Op,
        Plan,
        PlanContext,
        PlanResult,
    )
    from accord.platform.synchronous.unit_of_work import (  # type: ignore[import-not-found]
        UnitOfWork,
    )

    INTERIM = False
except ImportError:  # the platform's write path is not on main yet
    from accord.memory._interim_platform import (
        AsyncUnitOfWork,
        Counts,
        Expect,
        Group,
        Op,
        Plan,
        PlanContext,
        PlanResult,
        UnitOfWork,
    )

    INTERIM = True

LONG_TERM_MEMORY = "long_term_memory"
MEMORY_HISTORY = "memory_history"

__all__ = [
    "INTERIM",
    "LONG_TERM_MEMORY",
    "MEMORY_HISTORY",
    "AsyncUnitOfWork",
    "Counts",
    "Expect",
    "Group",
    "Op",
    "Plan",
    "PlanContext",
    "PlanResult",
    "UnitOfWork",
]
