"""The kernel's hooks and the phases they run in.

A hook is an object with a ``name`` and one method per phase it takes part in. The kernel
(the unit of work) calls the phases in this order for every plan, whatever the order the
hooks were registered in (within one phase, registration order):

``refresh_read(db)`` then ``refreshed(db, found, error)``
    before ``check`` (a plan, for each database it writes) and before ``read`` (a read):
    the hook may name ONE read of its own that is due (:class:`RefreshRead`; None when
    nothing is due, which must be cheap, as it is asked on every operation). The kernel
    makes it through its own read path (the read hooks apply), outside any transaction,
    and hands the documents (or the error) to ``refreshed``. A hook keeps its state fresh
    this way without doing I/O itself: governance re-reads the policy stored in the
    database at most every few seconds. A hook must not name a read while its previous
    one is under way (the kernel's read of it would ask again).
``check(plan)``
    before the transaction; pure. May refuse the plan by raising
    (:class:`~accord.errors.PermissionDenied`, :class:`~accord.errors.InvalidInputError`):
    nothing of it is sent. The tenancy guard and governance's policy are checks. Checks see
    the plan as its producer built it (derived groups are accord's own consequences of
    a write that was allowed).
``derive(plan)``
    before the transaction; pure. May add groups (and read the plan's events): the outbox
    inserts, a memory's vectors. May also rewrite the ops of the plan's groups and its
    context's guard, provided a rewrite changes only what an op writes into the documents
    it already reaches (the checks ran before it): governance's retention stamps
    ``expire_at`` this way.
``seal_reads(batch)`` then ``seal(batch, found)``
    INSIDE each transaction attempt, on every retry, once all plans of the batch are final
    (checked, derived, their groups named). ``seal_reads`` names documents to read in the
    transaction's snapshot (:class:`SealRead`); the kernel reads them in the session and
    hands them to ``seal``, which returns groups to write in the same transaction (after
    the plans' own writes). Both are pure: the kernel does the I/O, so one hook serves the
    sync and the async kernel alike. An audit chain reads its stream heads here and
    appends records and new heads; a write conflict on a head retries the whole attempt,
    and ``seal`` runs again on fresh heads. A seal group's guard may raise
    :class:`SealConflict` to retry the attempt (an optimistic head cache that was stale).
    A seal hook may also replace the values an op of the batch writes (never what it
    reaches: its filter, its ``_id``), provided it starts again from the values the plan
    gave on every attempt: governance's encryption turns payload fields into ciphertext
    here, under data keys read in the transaction's snapshot (or created in it), before
    the audit hook records the ops.
``read(request)``
    around every read (:class:`ReadRequest`): may refuse (raise), narrow the filter
    (return a new request, e.g. :meth:`ReadRequest.narrowed`) or record; returns the
    request to run.
``decode_reads(request, docs)`` then ``decode(request, docs, found)``
    after every read (``find``, ``find_one``, ``iterate``, ``aggregate``), on the documents
    it returned: ``decode_reads`` names the reads the hook needs to turn them back into
    what was written (:class:`RefreshRead`; e.g. the data keys of encrypted values), the
    kernel makes them through its own read path as the reader's principal (so the read
    hooks and the policy apply), and ``decode`` returns the documents to hand to the
    caller. Governance's encryption decrypts here. Documents a plan's
    ``find_one_and_update`` returns are not decoded (claims of unencrypted classes).
``refused(refusal)``
    after a check or read hook refused an operation with
    :class:`~accord.errors.PermissionDenied`: may return a plan that the kernel runs on its
    own, outside anything refused (governance's audit records denials so).

A hook with none of these methods is refused at registration.

Not a phase: a hook that writes collections of its own (an audit trail's records and
heads) names them with ``collections(db) -> {name: HookCollection}``; every component's
catalog setup (:class:`~accord.platform.asynchronous.catalog.AsyncCatalog`) creates them
in its database, with their validator and indexes, and records them as the hook's.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from pymongo.errors import PyMongoError

from accord.errors import ConfigurationError
from accord.platform.context import ReadContext
from accord.platform.plan import Group, Plan

PHASES = ("refresh", "check", "derive", "seal", "read", "decode", "refused")
Phase = Literal["refresh", "check", "derive", "seal", "read", "decode", "refused"]
ReadKind = Literal["find", "aggregate", "count", "distinct"]


@runtime_checkable
class Hook(Protocol):
    """Any hook: a name; the phases are the methods it defines (module docstring)."""

    name: str


class CheckHook(Protocol):
    name: str

    def check(self, plan: Plan) -> None: ...


class DeriveHook(Protocol):
    name: str

    def derive(self, plan: Plan) -> None: ...


@dataclass(frozen=True)
class RefreshRead:
    """A read a refresh hook needs before an operation (module docstring): the documents of
    ``collection`` (artifact class ``artifact``) in the operation's database matching
    ``filter``, sorted by ``sort``, at most ``limit`` (0: all), read in a context of
    ``tenant_id`` for ``operation``."""

    artifact: str
    collection: str
    filter: Mapping[str, Any]
    operation: str
    sort: Sequence[tuple[str, int]] | None = None
    limit: int = 0
    tenant_id: str = "*"


class RefreshHook(Protocol):
    name: str

    def refresh_read(self, db: str) -> RefreshRead | None: ...

    def refreshed(self, db: str, found: list[Any] | None, error: BaseException | None) -> None: ...


@dataclass(frozen=True)
class SealRead:
    """A read a seal hook needs inside the transaction: the documents of ``collection``
    matching ``filter``, in ``sort`` order (None: the server's), at most ``limit`` (0:
    all), handed back under ``key``."""

    key: str
    db: str
    collection: str
    filter: Mapping[str, Any]
    limit: int = 0
    sort: Sequence[tuple[str, int]] | None = None


@dataclass
class SealBatch:
    """What one transaction attempt writes, final: the plans (checked, derived, their
    groups named as they will be written), in order.

    ``transaction_id`` is the same on every attempt of one ``execute``; ``attempt``
    counts from 1 (0: the kernel asking, before any transaction, whether a single-op
    plan needs one; the groups a seal returns then are only tested for being there);
    ``found`` holds what the plans' ``find_one_and_update`` ops returned
    in this attempt (per group name).
    """

    plans: Sequence[Plan]
    transaction_id: str
    attempt: int = 1
    found: Mapping[str, list[Any]] = field(default_factory=dict)

    def groups(self) -> Iterator[tuple[Plan, Group]]:
        """Every group that writes something, with its plan."""
        for plan in self.plans:
            for group in plan.groups:
                if group.ops:
                    yield plan, group


class SealHook(Protocol):
    name: str

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]: ...

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]: ...


@dataclass(frozen=True)
class HookCollection:
    """A collection a hook writes (module docstring): its artifact class, its
    ``$jsonSchema`` (or any query-style) ``validator`` applied with ``validationLevel:
    strict``, and its indexes (pymongo ``IndexModel`` objects)."""

    artifact: str
    validator: Mapping[str, Any] | None = None
    indexes: Sequence[Any] = ()


class SealConflict(PyMongoError):
    """Raised by a seal group's guard (``Expect.error``) to run the attempt again: what the
    seal hook assumed (a cached chain head) was not current. Labelled like a write
    conflict, so the transaction is retried within the kernel's timeout."""

    def __init__(self, message: str = "a seal hook's assumption was stale") -> None:
        super().__init__(message)
        self._add_error_label("TransientTransactionError")


@dataclass(frozen=True)
class ReadRequest:
    """One read as the read hooks see it. ``filter`` for find/count/distinct, ``pipeline``
    for aggregate."""

    context: ReadContext
    artifact: str
    db: str
    collection: str
    kind: ReadKind
    filter: Mapping[str, Any] | None = None
    pipeline: Sequence[Mapping[str, Any]] | None = None

    def narrowed(self, extra: Mapping[str, Any]) -> ReadRequest:
        """This read, restricted further by ``extra`` (both must match). For an aggregate,
        ``extra`` becomes a ``$match`` after a leading ``$vectorSearch`` (which must stay
        first) or before everything else."""
        if self.kind == "aggregate":
            stages = list(self.pipeline or [])
            at = 1 if stages and "$vectorSearch" in stages[0] else 0
            stages.insert(at, {"$match": dict(extra)})
            return replace(self, pipeline=stages)
        base = dict(self.filter or {})
        return replace(self, filter={"$and": [base, dict(extra)]} if base else dict(extra))


class ReadHook(Protocol):
    name: str

    def read(self, request: ReadRequest) -> ReadRequest: ...


@dataclass(frozen=True)
class Refusal:
    """An operation a check or read hook refused: the plan or the read, and the error."""

    context: Any  # WriteContext or ReadContext
    error: BaseException
    plan: Plan | None = None
    read: ReadRequest | None = None


class DecodeHook(Protocol):
    name: str

    def decode_reads(self, request: ReadRequest, docs: list[Any]) -> Sequence[RefreshRead]: ...

    def decode(self, request: ReadRequest, docs: list[Any], found: list[Any]) -> list[Any]: ...


class SealRefusal(Exception):
    """What a seal hook raises to refuse its transaction and have the refusal recorded
    (mixed into the error the caller gets, e.g. an ``InvalidInputError``): the kernel lets
    the transaction abort, then hands ``refusal`` to the ``refused`` hooks, in a
    transaction of its own, once however many attempts it took. ``refusal`` None: nothing
    to record (a copy of one already recorded)."""

    refusal: Refusal | None = None


class RefusalHook(Protocol):
    name: str

    def refused(self, refusal: Refusal) -> Plan | None: ...


class Hooks:
    """Registered hooks sorted by phase (registration order within a phase)."""

    def __init__(self, hooks: Sequence[Any] = ()) -> None:
        self.all: list[Any] = []
        self.refresh: list[RefreshHook] = []
        self.check: list[CheckHook] = []
        self.derive: list[DeriveHook] = []
        self.seal: list[SealHook] = []
        self.read: list[ReadHook] = []
        self.decode: list[DecodeHook] = []
        self.refused: list[RefusalHook] = []
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Any) -> None:
        name = getattr(hook, "name", None)
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a hook needs a non-empty string `name`, {hook!r} has none")
        if any(h.name == name for h in self.all):
            raise ConfigurationError(f"a hook named {name!r} is registered already")
        phases = phases_of(hook)
        if not phases:
            raise ConfigurationError(
                f"hook {name!r} takes part in no phase: define one or more of refresh_read(db) + "
                f"refreshed(db, found, error), check(plan), "
                f"derive(plan), seal_reads(batch) + seal(batch, found), read(request), "
                f"decode_reads(request, docs) + decode(request, docs, found), "
                f"refused(refusal) (docs/platform.md, 'Hooks')"
            )
        self.all.append(hook)
        for phase in phases:
            getattr(self, phase).append(hook)

    def names(self) -> list[str]:
        return [h.name for h in self.all]


def phases_of(hook: Any) -> list[Phase]:
    """The phases ``hook`` takes part in (by the methods it defines)."""
    found: list[Phase] = []
    has_refresh = callable(getattr(hook, "refresh_read", None))
    if has_refresh != callable(getattr(hook, "refreshed", None)):
        raise ConfigurationError(
            f"hook {getattr(hook, 'name', hook)!r} must define both refresh_read(db) and "
            f"refreshed(db, found, error), or neither"
        )
    if has_refresh:
        found.append("refresh")
    for phase in ("check", "derive", "read", "refused"):
        if callable(getattr(hook, phase, None)):
            found.append(phase)  # type: ignore[arg-type]
    has_seal = callable(getattr(hook, "seal", None))
    has_reads = callable(getattr(hook, "seal_reads", None))
    if has_seal != has_reads:
        raise ConfigurationError(
            f"hook {getattr(hook, 'name', hook)!r} must define both seal_reads(batch) and "
            f"seal(batch, found), or neither"
        )
    if has_seal:
        found.append("seal")
    has_decode = callable(getattr(hook, "decode", None))
    if has_decode != callable(getattr(hook, "decode_reads", None)):
        raise ConfigurationError(
            f"hook {getattr(hook, 'name', hook)!r} must define both decode_reads(request, "
            f"docs) and decode(request, docs, found), or neither"
        )
    if has_decode:
        found.append("decode")
    return sorted(found, key=PHASES.index)


def new_transaction_id() -> str:
    """An id for one ``execute`` (the same on each of its attempts)."""
    return secrets.token_hex(12)
