"""Legal holds: while one lasts, what it covers does not expire, is not swept and is not
erased.

A hold names a **tenant**, a **thread** (of a tenant), a **data subject** (a value of the
class's ``subject_fields``, e.g. ``metadata.user_id = "u-42"``, optionally within one
tenant) or an artifact **class** (``outbox``, ``business:orders``). Holds are documents of
accord's own ``hold`` class (``accord_holds``), written through the kernel.

Expiry is a per-document ``expire_at`` under a TTL index (:mod:`accord.governance.retention`),
so a hold *moves* ``expire_at`` of the documents it covers to ``held_expire_at`` (the TTL
monitor no longer sees them), and a held thread's run-registry document loses its
``expire_at`` (the sweep no longer sees the thread). Release moves them back for what no
other hold still covers: a document whose time passed during the hold expires at the
TTL monitor's next pass; one written during the hold is stamped from the release
(``now`` + its class's period). Running processes learn the holds of their database
through the kernel's ``refresh`` phase (:class:`HoldSet`), like the policy, and stamp
nothing on what they cover.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from accord.errors import InvalidInputError
from accord.platform.hooks import RefreshRead
from accord.platform.plan import Op

__all__ = ["HOLD_KINDS", "Hold", "HoldKind", "HoldSet", "Holds", "hold_id", "value_at"]

logger = logging.getLogger("accord.governance")

HoldKind = Literal["tenant", "thread", "subject", "class"]
HOLD_KINDS: tuple[HoldKind, ...] = ("tenant", "thread", "subject", "class")
OPERATION = "governance.holds_refresh"


def hold_id(kind: str, value: str, tenant_id: str | None) -> str:
    """The ``_id`` of a hold: one per (kind, tenant, value), so holding twice is one hold.

    ``kind:tenant:value`` (``*`` for every tenant) while that reads back one way only;
    a tenant holding ``:`` or named ``*`` would make two holds of two tenants one
    (thread ``acme:t1`` of tenant ``org`` and thread ``t1`` of tenant ``org:acme``), so
    its holds are ``kind~["tenant", "value"]`` (JSON) instead."""
    if not tenant_id:  # every tenant ("" as None, as filter() reads it)
        return f"{kind}:*:{value}"
    if ":" not in tenant_id and tenant_id != "*":
        return f"{kind}:{tenant_id}:{value}"
    return f"{kind}~" + json.dumps([tenant_id, value], ensure_ascii=False)


@dataclass(frozen=True)
class Hold:
    """One legal hold (module docstring)."""

    kind: HoldKind
    value: str
    tenant_id: str | None = None
    reason: str = ""
    by: str = ""
    at: datetime | None = None

    def __post_init__(self) -> None:
        if self.kind not in HOLD_KINDS:
            raise InvalidInputError(f"a hold is by {', '.join(HOLD_KINDS)}; got {self.kind!r}")
        if not isinstance(self.value, str) or not self.value or len(self.value) > 500:
            raise InvalidInputError(
                f"a hold needs a value (1 to 500 characters), got {self.value!r}"
            )
        if self.kind == "thread" and not self.tenant_id:
            raise InvalidInputError("a thread hold names the thread's tenant (--tenant)")
        if self.kind == "tenant" and self.tenant_id not in (None, self.value):
            raise InvalidInputError("a tenant hold names the tenant once")

    @property
    def id(self) -> str:
        return hold_id(self.kind, self.value, self.tenant_id if self.kind != "tenant" else None)

    def removal(self) -> list[Op]:
        """The ops that remove this hold's document: by its id, and by the id it had
        before :func:`hold_id` told two tenants apart, pinned to its fields (an id of
        that older form may be another tenant's hold)."""
        ops = [Op("delete", {"_id": self.id})]
        legacy = f"{self.kind}:{self.tenant_id or '*'}:{self.value}"
        if legacy != self.id:
            ops.append(Op("delete", {"_id": legacy, "kind": self.kind, "value": self.value,
                                     "tenant_id": self.tenant_id}))  # fmt: skip
        return ops

    def document(self) -> dict[str, Any]:
        return {"_id": self.id, "kind": self.kind, "value": self.value,
                "tenant_id": self.tenant_id, "reason": self.reason, "by": self.by,
                "at": self.at}  # fmt: skip

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Hold:
        return cls(doc["kind"], doc["value"], doc.get("tenant_id"), doc.get("reason", ""),
                   doc.get("by", ""), doc.get("at"))  # fmt: skip

    def describe(self) -> str:
        where = f" of tenant {self.tenant_id!r}" if self.tenant_id and self.kind != "tenant" else ""
        return f"{self.kind} {self.value!r}{where}"

    def filter(
        self, artifact: str, collection: str, subject_fields: Sequence[str]
    ) -> dict[str, Any] | None:
        """The documents of ``artifact`` (in ``collection``) this hold covers; None: none."""
        if self.kind == "tenant":
            return {"tenant_id": self.value}
        if self.kind == "thread":
            return {"tenant_id": self.tenant_id, "thread_id": self.value}
        if self.kind == "class":
            if self.value in (artifact, f"{artifact}:{collection}"):
                return {}
            return None
        if not subject_fields:
            return None
        match: dict[str, Any] = {"$or": [{f: self.value} for f in subject_fields]}
        if self.tenant_id:
            match["tenant_id"] = self.tenant_id
        return match


def value_at(doc: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` of ``doc`` (None where it is not)."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


@dataclass(frozen=True)
class Holds:
    """The holds of one database at one moment; ``unknown``: they could not be read, so
    everything counts as held (nothing is stamped to expire)."""

    holds: tuple[Hold, ...] = ()
    unknown: bool = False
    _tenants: frozenset[str] = field(default=frozenset(), repr=False)
    _threads: frozenset[tuple[str | None, str]] = field(default=frozenset(), repr=False)
    _classes: frozenset[str] = field(default=frozenset(), repr=False)

    @classmethod
    def of(cls, holds: Iterable[Hold]) -> Holds:
        found = tuple(holds)
        return cls(
            found,
            _tenants=frozenset(h.value for h in found if h.kind == "tenant"),
            _threads=frozenset((h.tenant_id, h.value) for h in found if h.kind == "thread"),
            _classes=frozenset(h.value for h in found if h.kind == "class"),
        )

    def holds_tenant(self, tenant_id: str | None) -> bool:
        return self.unknown or tenant_id in self._tenants

    def holds_thread(self, tenant_id: str, thread_id: str | None) -> bool:
        return self.holds_tenant(tenant_id) or (
            thread_id is not None and (tenant_id, thread_id) in self._threads
        )

    def holds_class(self, artifact: str, collection: str | None) -> bool:
        return (
            self.unknown or artifact in self._classes or f"{artifact}:{collection}" in self._classes
        )

    def subjects_in(self, subject_fields: Sequence[str]) -> list[Hold]:
        """The subject holds that can reach a class with ``subject_fields``."""
        if not subject_fields:
            return []
        return [h for h in self.holds if h.kind == "subject"]

    def clear_of_subjects(self, op: Op, subject_fields: Sequence[str]) -> bool:
        """Whether ``op`` surely writes no held subject's document: an insert or a
        replacement whose subject fields hold no held value (an update's document is
        not seen, so it may be one)."""
        if op.kind not in ("insert", "replace") or not isinstance(op.doc, Mapping):
            return False
        held = {h.value for h in self.subjects_in(subject_fields)}
        for path in subject_fields:
            value = value_at(op.doc, path)
            values = value if isinstance(value, list | tuple) else [value]
            if any(v in held for v in values if isinstance(v, str)):
                return False
        return True


@dataclass
class _Database:
    holds: Holds = field(default_factory=lambda: Holds(unknown=True))
    loaded: bool = False
    due: float = 0.0
    busy: bool = False
    warned: bool = False


class HoldSet:
    """The holds of each database a kernel touches, re-read at most every ``interval``
    seconds through the kernel's ``refresh`` phase (as :mod:`accord.governance.stored`
    does for the policy). Until a database's holds were read once (or when the read is
    refused), everything there counts as held: nothing is stamped to expire."""

    def __init__(
        self,
        collection: Callable[[str], str],
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.collection = collection
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._dbs: dict[str, _Database] = {}

    def of(self, db: str) -> Holds:
        """The holds of ``db`` as last read (no I/O)."""
        state = self._dbs.get(db)
        return state.holds if state is not None else Holds(unknown=True)

    def refresh_read(self, db: str) -> RefreshRead | None:
        state = self._dbs.get(db)
        now = self._clock()
        if state is not None and (state.busy or now < state.due):
            return None
        with self._lock:
            state = self._dbs.setdefault(db, _Database())
            if state.busy or now < state.due:
                return None
            state.busy = True
        return RefreshRead("hold", self.collection(db), {}, OPERATION)

    def refreshed(self, db: str, found: list[Any] | None, error: BaseException | None) -> None:
        state = self._dbs[db]
        try:
            state.due = self._clock() + self.interval
            if error is not None:
                if not state.warned:
                    state.warned = True
                    logger.warning(
                        "accord: reading the legal holds of %s failed (%s); %s", db, error,
                        "keeping the last ones read" if state.loaded
                        else "nothing written there is stamped to expire meanwhile",
                    )  # fmt: skip
                return
            holds = []
            for doc in found or []:
                try:
                    holds.append(Hold.from_document(doc))
                except (KeyError, InvalidInputError) as exc:
                    logger.error("accord: hold %r of %s is malformed (%s)", doc.get("_id"), db, exc)
            state.holds, state.loaded = Holds.of(holds), True
        finally:
            with self._lock:
                state.busy = False
