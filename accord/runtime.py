"""accord's composition root: one client, one unit of work, and the parts built on them.

Every part of accord writes through the platform's unit of work, and what the unit of work
adds to a write (the tenancy guard, the outbox, memory's vectors; governance's policy and
audit next) comes from the hooks registered on it. Built one by one, each part would make
its own unit of work and a hook registered on one would miss the writes of the others.
:class:`Accord` (and :class:`AsyncAccord` for pymongo's ``AsyncMongoClient``) makes ONE
and hands it to the checkpointer, the memory service and store, and the aggregator::

    from accord.runtime import Accord

    app = Accord()                             # MONGODB_URI, or the embedded engine
    graph = builder.compile(checkpointer=app.checkpointer(), store=app.store())
    with app.background_aggregator():          # long-term memory from the messages
        graph.invoke(...)

    async with AsyncAccord() as app:           # the same on AsyncMongoClient
        graph = builder.compile(checkpointer=await app.checkpointer(),
                                store=await app.store())
        async with await app.background_aggregator():   # a task on this loop
            await graph.ainvoke(...)

A hook passed as ``hooks=`` (an audit trail, a policy check) sees every plan of every part,
and runs inside the same transaction as the write it extends. This is the only module that
may import ``accord.governance`` (tests/test_module_boundaries.py keeps that true): with
``audit="policy"``, ``"metadata"`` or ``"full"`` (or ``ACCORD_AUDIT``), every kernel gets
governance's audit hook, which appends a hash-chained record of every write of an audited
class in its transaction (docs/governance.md, "Audit trail").
"""

from __future__ import annotations

import importlib
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.store.base import TTLConfig
from pymongo import AsyncMongoClient

from accord.checkpointers import AccordSaver, AsyncAccordSaver
from accord.errors import ConfigurationError, InvalidInputError, MasterKeyError
from accord.governance.audit_hook import MODES as AUDIT_MODES
from accord.governance.audit_hook import AuditHook
from accord.governance.audit_records import RECORDS as AUDIT_RECORDS
from accord.governance.crypto import MASTER_KEY_ENV, PREVIOUS_MASTER_KEY_ENV, MasterKey
from accord.governance.encryption import EncryptionHook
from accord.governance.enforcement import DENIALS, PolicyHook
from accord.governance.erasure import ErasureReport, erase_subject
from accord.governance.hold_guard import HoldGuard
from accord.governance.holding import holds_collection
from accord.governance.holds import HoldSet
from accord.governance.loading import POLICY_ENV, PolicySource, resolve_policy
from accord.governance.policy import Policy
from accord.governance.retention import RetentionHook, thread_ttl
from accord.governance.shredding import rewrap_keys, shred_tenant
from accord.governance.stored import StoredPolicies, interval_from_env
from accord.governance.subjects import export_subject, validate_subject
from accord.governance.sweep import SweepReport, sweep_once
from accord.memory.aggregator import (
    Aggregator,
    AggregatorConfig,
    AsyncAggregator,
    AsyncBackgroundAggregator,
    BackgroundAggregator,
)
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.asynchronous.store import AsyncAccordStore
from accord.memory.synchronous.service import MemoryService
from accord.memory.synchronous.store import AccordStore
from accord.platform import connect, connect_async
from accord.platform.artifacts import AUDIT, POLICY
from accord.platform.asynchronous.run_queue import AsyncRunQueue
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.context import Principal, ReadContext
from accord.platform.settings import Settings
from accord.platform.synchronous.run_queue import RunQueue
from accord.platform.synchronous.unit_of_work import UnitOfWork
from accord.platform.transaction import DEFAULT_TIMEOUT, default_hooks

__all__ = [
    "Accord", "AsyncAccord", "compact_storage", "effective_policy", "erase_subject_data",
    "export_subject_data", "kernel", "policy_denials", "rewrap_data_keys", "shred_tenant_keys",
    "sweep",
]  # fmt: skip


#: Extra hooks for every kernel of the process, as ``module:factory`` names separated by
#: commas; each factory is called once per kernel and returns a hook.
HOOKS_ENV = "ACCORD_HOOKS"
#: The audit trail of every kernel of the process: ``off`` (default), ``policy`` (each class
#: in its policy's mode), ``metadata`` (records with hashes of what was written, at least)
#: or ``full`` (and the images); see :func:`audit_hooks`.
AUDIT_ENV = "ACCORD_AUDIT"


def kernel(
    client: Any,
    *,
    hooks: Sequence[Any] = (),
    timeout: float = DEFAULT_TIMEOUT,
    client_bulk: bool | None = None,
    principal: Principal | None = None,
    policy: PolicySource = None,
    audit: str | None = None,
    policy_refresh: float | None = None,
) -> Any:
    """A unit of work (the kernel) on ``client`` with accord's hooks: the defaults (tenancy
    guard, outbox), governance's policy (``policy``: a ``Policy`` or a policy file; else
    the file ``ACCORD_POLICY`` names; else, per database, the newest policy ``accord
    governance apply`` stored in it, re-read at most every ``policy_refresh`` seconds
    (default ``ACCORD_POLICY_REFRESH``, else 5); else the built-in default;
    docs/governance.md, "Which policy is enforced"), the
    hooks configured in ``ACCORD_HOOKS`` (:func:`configured_hooks`), then ``hooks``, then
    governance's encryption (:func:`encryption_hook`: the classes the policy encrypts, under
    ``ACCORD_MASTER_KEY``), then the audit hook when ``audit`` (default ``ACCORD_AUDIT``) is
    on (:func:`audit_hooks`): last, so its records cover what every other hook added. A ``UnitOfWork`` for a
    ``MongoClient``, an ``AsyncUnitOfWork`` for an ``AsyncMongoClient``. The only place
    units of work are made: the roots below use it, and so does a part constructed on its
    own (the drop-in ``AccordSaver(client)``), so every door passes the same hooks."""
    enforced = policy_hook(policy, policy_refresh)
    every = [
        *default_hooks(),
        enforced,
        retention_hook(enforced, policy_refresh),
        HoldGuard(lambda db: enforced.rules(db).policy),
        *configured_hooks(),
        *hooks,
        encryption_hook(enforced),
        *audit_hooks(audit, lambda db: enforced.rules(db).policy),
    ]
    if isinstance(client, AsyncMongoClient):
        return AsyncUnitOfWork(
            client, hooks=every, timeout=timeout, client_bulk=client_bulk, principal=principal
        )
    return UnitOfWork(
        client, hooks=every, timeout=timeout, client_bulk=client_bulk, principal=principal
    )


def policy_hook(policy: PolicySource = None, refresh: float | None = None) -> PolicyHook:
    """governance's policy hook: ``policy`` (or ``ACCORD_POLICY``'s file) everywhere when
    given; else each database's stored policy, the built-in default where none is."""
    resolved = resolve_policy(policy)
    if policy is not None or os.environ.get(POLICY_ENV, "").strip():
        return PolicyHook(resolved)
    interval = refresh if refresh is not None else interval_from_env()
    return PolicyHook(resolved, stored=StoredPolicies(resolved, interval))


def encryption_hook(enforced: PolicyHook) -> EncryptionHook:
    """governance's encryption hook (docs/governance.md, "Encryption and crypto-shredding"):
    the payloads of the classes the enforced policy marks ``encryption = "tenant"`` or
    ``"subject"``, under data keys wrapped by the master key ``ACCORD_MASTER_KEY``. A
    malformed master key is a ``MasterKeyError`` here; a missing one, when the policy
    given (argument or ``ACCORD_POLICY``) encrypts a class, too; a policy stored in the
    database that encrypts meets it at the first write or read of an encrypted value."""
    master = MasterKey.from_env()
    if master is None and enforced.stored is None:
        encrypted = sorted(
            name for name, cls in enforced.rules(None).policy.classes.items()
            if cls.encryption != "off"
        )  # fmt: skip
        if encrypted:
            raise MasterKeyError(
                f"the policy encrypts {', '.join(encrypted)}, and {MASTER_KEY_ENV} is not "
                f"set: set it to the master key (32 random bytes, base64) before starting. "
                f"Nothing was read or written"
            )
    return EncryptionHook(lambda db: enforced.rules(db).policy, master)


def retention_hook(enforced: PolicyHook, refresh: float | None = None) -> RetentionHook:
    """governance's retention hook (``expire_at`` from the policy ``enforced`` applies
    to each database, nothing on what a legal hold covers; docs/governance.md)."""

    def policy_of(db: str) -> Any:
        return enforced.rules(db).policy

    interval = refresh if refresh is not None else interval_from_env()
    holds = HoldSet(lambda db: holds_collection(policy_of(db)), interval)
    return RetentionHook(policy_of, holds)


def effective_policy(uow: Any, db_name: str) -> Policy:
    """The policy ``uow`` (a kernel of :func:`kernel`, sync) enforces on ``db_name``, once
    the policy stored there was read (one read of the policy class, through the kernel;
    its ``refresh`` phase loads the stored policy and the legal holds)."""
    hook = next(h for h in uow.hooks.all if isinstance(h, PolicyHook))
    cls = hook.rules(db_name).policy.of(POLICY.name)
    collection = (cls.collection if cls is not None else None) or "accord_policies"
    uow.count(ReadContext("*", operation="governance.policy"), POLICY.name, db_name,
              collection, {"_id": "head"})  # fmt: skip
    return hook.rules(db_name).policy


def sweep(
    client: Any,
    db_name: str = "accord",
    *,
    limit: int = 1000,
    batch: int = 1000,
    pause: float = 0.0,
    principal: Principal | None = None,
    policy: PolicySource = None,
    progress: Callable[[str, int], None] | None = None,
) -> SweepReport:
    """One retention sweep of ``db_name`` (``accord governance sweep``;
    :mod:`accord.governance.sweep`): keep the latest N checkpoints per thread and delete
    expired threads, skipping held ones, at most ``limit`` threads per rule, at most
    ``batch`` documents per transaction, ``pause`` seconds between transactions; through
    a kernel acting as ``principal`` (default the operating-system user, role admin) with
    the checkpointer doing the deleting (so a kept checkpoint keeps what it needs)."""
    who = principal or Principal.os_user()
    uow = kernel(client, principal=who, policy=policy)
    effective = effective_policy(uow, db_name)
    ttl = thread_ttl(effective)
    saver = AccordSaver(client, db_name=db_name, uow=uow)
    saver.setup()  # without a ttl: a saver set up with one starts its own background sweeper
    saver.ttl = ttl.total_seconds() if ttl is not None else None  # prune's commits stamp it
    # the audit cut is recorded in the chain it cuts: its kernel has the audit hook on
    mode = os.environ.get(AUDIT_ENV, "").strip().lower()
    auditing = kernel(client, principal=who, policy=policy,
                      audit=mode if mode in ("metadata", "full") else "metadata")  # fmt: skip
    return sweep_once(uow, db_name, effective, saver, limit=limit, batch=batch, pause=pause,
                      progress=progress, audit=auditing, principal=who)  # fmt: skip


def export_subject_data(
    client: Any,
    subject: str,
    out: str | os.PathLike[str],
    db_name: str = "accord",
    *,
    tenant_id: str | None = None,
    principal: Principal | None = None,
    policy: PolicySource = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Write everything ``db_name`` holds about data subject ``subject`` to the directory
    ``out`` (``accord governance export-subject``; GDPR Art. 15): a JSONL file per class
    and a manifest (:func:`accord.governance.subjects.export_subject`), read through a
    kernel acting as ``principal`` (default the operating-system user, role admin)."""
    subject, tenant_id = validate_subject(subject, tenant_id)
    _sync_client(client, "export_subject_data")
    uow = kernel(client, principal=principal or Principal.os_user(), policy=policy)
    effective = effective_policy(uow, db_name)
    return export_subject(uow, db_name, effective, subject, out, tenant_id=tenant_id,
                          progress=progress)  # fmt: skip


def erase_subject_data(
    client: Any,
    subject: str,
    db_name: str = "accord",
    *,
    tenant_id: str | None = None,
    principal: Principal | None = None,
    policy: PolicySource = None,
    audit: str | None = None,
    compact: bool = True,
    progress: Callable[[str, int], None] | None = None,
) -> ErasureReport:
    """Erase data subject ``subject`` from ``db_name`` (``accord governance erase``; GDPR
    Art. 17; :mod:`accord.governance.erasure`), through a kernel acting as ``principal``
    (default the operating-system user, role admin), then compact the storage
    (:func:`compact_storage`) unless ``compact=False``. Raises ``SubjectHeld`` (nothing
    erased) when a legal hold covers any of it. The erasure is recorded in the audit
    trail: with ``audit`` (default ``ACCORD_AUDIT``) off, a database that has an audit
    trail gets its records anyway (mode ``metadata``), so no erasure goes unrecorded."""
    subject, tenant_id = validate_subject(subject, tenant_id)
    _sync_client(client, "erase_subject_data")
    who = principal or Principal.os_user()
    chosen = _recorded_audit(client, who, policy, audit, db_name, "governance.erase")
    uow = kernel(client, principal=who, policy=policy, audit=chosen)
    effective = effective_policy(uow, db_name)
    report = erase_subject(uow, db_name, effective, subject, tenant_id=tenant_id,
                           progress=progress)  # fmt: skip
    if compact:
        report.compacted = compact_storage(client, db_name)
    return report


def shred_tenant_keys(
    client: Any,
    tenant_id: str,
    db_name: str = "accord",
    *,
    principal: Principal | None = None,
    policy: PolicySource = None,
    audit: str | None = None,
) -> int:
    """Destroy every data key of ``tenant_id`` in ``db_name`` (``accord governance
    shred-tenant``; :func:`accord.governance.shredding.shred_tenant`): the tenant's
    encrypted payloads become unreadable everywhere, backups and exports included. Through
    a kernel acting as ``principal`` (default the operating-system user, role admin);
    ``LegalHoldError`` (nothing destroyed) while a hold covers the tenant. Returns how many
    keys were destroyed. Recorded in the audit trail as :func:`erase_subject_data` is."""
    if not isinstance(tenant_id, str) or not tenant_id.strip():
        raise InvalidInputError(f"a tenant is a non-empty string, got {tenant_id!r}")
    validate_subject("tenant", tenant_id)  # no operator, no NUL
    _sync_client(client, "shred_tenant_keys")
    who = principal or Principal.os_user()
    chosen = _recorded_audit(client, who, policy, audit, db_name, "governance.shred-tenant")
    uow = kernel(client, principal=who, policy=policy, audit=chosen)
    return shred_tenant(uow, db_name, effective_policy(uow, db_name), tenant_id)


def rewrap_data_keys(
    client: Any,
    db_name: str = "accord",
    *,
    principal: Principal | None = None,
    policy: PolicySource = None,
    audit: str | None = None,
) -> int:
    """Rotate the master key (``accord governance rewrap-keys``): re-wrap every data key
    of ``db_name`` under ``ACCORD_MASTER_KEY``, unwrapping with
    ``ACCORD_MASTER_KEY_PREVIOUS`` (:func:`accord.governance.shredding.rewrap_keys`),
    through a kernel acting as ``principal`` (default the operating-system user, role
    admin). Returns how many keys were re-wrapped; 0 when all are current. Recorded in
    the audit trail as :func:`erase_subject_data` is."""
    _sync_client(client, "rewrap_data_keys")
    master = MasterKey.from_env()
    if master is None:
        raise MasterKeyError(
            f"rewrapping needs the new master key in {MASTER_KEY_ENV} and the old one in "
            f"{PREVIOUS_MASTER_KEY_ENV}; {MASTER_KEY_ENV} is not set. Nothing was changed"
        )
    who = principal or Principal.os_user()
    chosen = _recorded_audit(client, who, policy, audit, db_name, "governance.rewrap-keys")
    uow = kernel(client, principal=who, policy=policy, audit=chosen)
    return rewrap_keys(uow, db_name, effective_policy(uow, db_name), master)


def _recorded_audit(
    client: Any,
    who: Principal,
    policy: PolicySource,
    audit: str | None,
    db_name: str,
    operation: str,
) -> str:
    """The audit mode of an administrative task that destroys or re-keys data: ``audit``
    (default ``ACCORD_AUDIT``), except that with it off a database that has an audit
    trail gets its records anyway (``metadata``), so no such task goes unrecorded."""
    chosen = audit if audit is not None else os.environ.get(AUDIT_ENV, "")
    if chosen.strip().lower() not in ("", "off"):
        return chosen
    probe = kernel(client, principal=who, policy=policy, audit="off")
    has_trail = probe.find_one(ReadContext("*", operation=operation), AUDIT.name, db_name,
                               AUDIT_RECORDS, {}, projection={"_id": 1})  # fmt: skip
    return "metadata" if has_trail is not None else "off"


def _sync_client(client: Any, what: str) -> None:
    if isinstance(client, AsyncMongoClient):
        raise ConfigurationError(
            f"{what} runs on a pymongo MongoClient (an administrative task), not an "
            "AsyncMongoClient; open a MongoClient on the same URI"
        )


def compact_storage(client: Any, db_name: str = "accord") -> str:
    """Make what was deleted physically unrecoverable from the storage, where accord can:
    on the embedded engine, its ``compact`` command (SQLite ``VACUUM`` with
    ``secure_delete`` and the WAL truncated: docs/engine.md, "Physical deletion"); on
    MongoDB nothing (WiredTiger reuses the space of deleted documents; run ``compact``
    per collection in a maintenance window if the files must shrink), said in one log
    line. Returns what it did, in words."""
    _sync_client(client, "compact_storage")
    info = client.admin.command("buildInfo")
    if info.get("gitVersion") != "accord-embedded":
        said = (
            f"storage not compacted: {db_name} is on MongoDB {info.get('version', '?')}, whose "
            "WiredTiger reuses the space of deleted documents; run compact per collection "
            "in a maintenance window if the files must shrink"
        )
        logging.getLogger("accord.governance").info("accord: %s", said)
        return said
    reply = client[db_name].command("compact", AUDIT_RECORDS)
    return (
        f"storage compacted ({reply.get('bytesBefore', 0)} -> {reply.get('bytesAfter', 0)} "
        f"bytes, {reply.get('seconds', 0.0):.2f} s)"
    )


def policy_denials() -> dict[tuple[str, str, str], int]:
    """Operations the governance policy refused in this process so far, counted per
    (principal, action, class) (docs/governance.md)."""
    return DENIALS.snapshot()


def configured_hooks() -> list[Any]:
    """The hooks named by ``ACCORD_HOOKS`` (``package.module:factory,...``), one new hook
    per factory call. A name that does not resolve is a ``ConfigurationError`` naming it."""
    spec = os.environ.get(HOOKS_ENV, "").strip()
    found: list[Any] = []
    for name in filter(None, (part.strip() for part in spec.split(","))):
        module_name, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(
                f"{HOOKS_ENV} names {name!r}, which is not an importable 'module:factory' "
                f"({type(exc).__name__}: {exc}); fix or unset {HOOKS_ENV}"
            ) from None
        found.append(factory())
    return found


def audit_hooks(mode: str | None = None, policy: Callable[[str], Any] | None = None) -> list[Any]:
    """governance's audit hook for ``mode`` (``off``, ``metadata``, ``full``, ``policy``;
    default ``ACCORD_AUDIT``, else ``off``): ``[]`` when off. ``policy``: the policy
    enforced on a database (:func:`kernel` passes its policy hook's), whose per-class
    ``audit`` modes apply: each class's under ``policy``, at least ``metadata`` /
    ``full`` under those (docs/governance.md, "Turning it on"). Another value is a
    ``ConfigurationError`` naming it."""
    chosen = (mode if mode is not None else os.environ.get(AUDIT_ENV, "")).strip().lower()
    if chosen in ("", "off"):
        return []
    if chosen not in AUDIT_MODES:
        raise ConfigurationError(
            f"audit mode {chosen!r} (argument or {AUDIT_ENV}) is not one of off, "
            f"{', '.join(AUDIT_MODES)}"
        )
    if chosen == "policy" and policy is None:
        raise ConfigurationError(
            f"audit mode 'policy' (argument or {AUDIT_ENV}) needs the policy enforced: "
            f"build the kernel with accord.runtime.kernel"
        )
    return [AuditHook(chosen, policy=policy)]  # type: ignore[arg-type]


_Service = TypeVar("_Service", MemoryService, AsyncMemoryService)
_UnitOfWork = TypeVar("_UnitOfWork", UnitOfWork, AsyncUnitOfWork)


class _Root(Generic[_Service, _UnitOfWork]):
    """What both roots share: the client, the one unit of work, the settings of the parts
    and one memory service per tenant. Each root names its client's ``connect`` and its
    unit of work's class; the parts differ only by awaiting."""

    _connect: Callable[..., Any]

    def __init__(
        self,
        uri: str | None = None,
        *,
        client: Any = None,
        data_dir: str | os.PathLike[str] | None = None,
        db_name: str | None = None,
        embedder: Any = None,
        dims: int | None = None,
        hooks: Sequence[Any] = (),
        timeout: float = DEFAULT_TIMEOUT,
        principal: Principal | None = None,
        policy: PolicySource = None,
        audit: str | None = None,
    ) -> None:
        if db_name is None:  # ACCORD_DATABASE, as the memory commands read it
            db_name = Settings().database
        if not isinstance(db_name, str) or not db_name or "." in db_name or "$" in db_name:
            raise ConfigurationError(
                f"db_name must be a MongoDB database name (no '.', no '$'), got {db_name!r}"
            )
        self.db_name = db_name
        self.embedder = embedder
        self.dims = dims
        self._services: dict[str, _Service] = {}
        #: the savers built here: told at once when an aggregator is set up
        self._savers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._owns_client = client is None
        self.client = client if client is not None else self._connect(uri, data_dir=data_dir)
        self.timeout = timeout
        self.uow: _UnitOfWork = kernel(
            self.client,
            hooks=hooks,
            timeout=timeout,
            principal=principal,
            policy=policy,
            audit=audit,
        )

    def _new_service(self, service_class: Callable[..., _Service], tenant_id: str) -> _Service:
        return service_class(
            self.client, tenant_id=tenant_id, db_name=self.db_name,
            embedder=self.embedder, dims=self.dims, uow=self.uow,
        )  # fmt: skip

    def _store_index(self, service: Any, fields: Sequence[str] | None) -> dict[str, Any]:
        return {"dims": service.dims, "fields": list(fields) if fields else ["$"]}

    def _consumer_registered(self, config: AggregatorConfig) -> None:
        """An aggregator now consumes ``config.outbox``: the savers built here write its
        events from their next commit (others see it within a few seconds)."""
        for saver in list(self._savers):
            if saver.collections.outbox == config.outbox:
                saver.outbox_gate.consumer_registered()

    def _aggregator_config(self, config: AggregatorConfig | None) -> AggregatorConfig:
        config = config or AggregatorConfig(db_name=self.db_name)
        if config.db_name != self.db_name:
            raise ConfigurationError(
                f"the aggregator's config names database {config.db_name!r}, this root "
                f"{self.db_name!r}; use one database"
            )
        return config


class Accord(_Root[MemoryService, UnitOfWork]):
    """accord on a pymongo ``MongoClient``: checkpointer, memory store and aggregator on
    one unit of work.

    Args:
        uri: a MongoDB connection string; default ``MONGODB_URI``, else the embedded
            engine for ``data_dir`` (started if needed).
        client: an existing ``MongoClient`` instead of ``uri`` (not closed by :meth:`close`).
        db_name: the database of every part; default ``ACCORD_DATABASE``, else ``accord``.
        embedder, dims: long-term memory's embedder (see
            :func:`accord.memory.embedders.resolve_embedder`; default the hashing
            embedder). The store and the aggregator use the same one.
        hooks: extra unit-of-work hooks (governance's audit and policy checks), run after
            the tenancy guard and the outbox, on every write of every part.
        timeout: bound in seconds on one transaction including its retries.
        principal: who the parts act as by default (the ``runtime`` service; the CLI
            passes the OS user, the HTTP API and MCP an API key's principal per request).
        policy: the governance policy every part is held to: a ``Policy`` or the path of
            a policy file; default the file ``ACCORD_POLICY`` names, else the built-in
            default (docs/governance.md).
        audit: the audit trail: ``off``, ``policy``, ``metadata`` or ``full`` (default
            ``ACCORD_AUDIT``, else off; :func:`audit_hooks`).
    """

    _connect = staticmethod(connect)

    def checkpointer(self, **kwargs: Any) -> AccordSaver:
        """An :class:`~accord.checkpointers.AccordSaver` on this root's unit of work, set up.
        ``kwargs`` as for the saver (``tenant_id``, ``ttl``, collection names, ...)."""
        kwargs.setdefault("timeout", self.timeout)
        saver = AccordSaver(self.client, db_name=self.db_name, uow=self.uow, **kwargs)
        saver.setup()
        self._savers.add(saver)
        return saver

    def memory(self, tenant_id: str = "default") -> MemoryService:
        """The memory service of ``tenant_id`` (one per tenant), set up."""
        if tenant_id not in self._services:
            service = self._new_service(MemoryService, tenant_id)
            service.setup()
            self._services[tenant_id] = service
        return self._services[tenant_id]

    def store(
        self,
        tenant_id: str | None = None,
        *,
        fields: Sequence[str] | None = None,
        ttl: TTLConfig | None = None,
    ) -> AccordStore:
        """A LangGraph ``BaseStore`` over long-term memory (what the aggregator derives and
        what agents put share its namespaces): in a run, the run's tenant
        (``configurable.tenant_id``), else ``"default"``; with ``tenant_id``, that tenant
        only. ``fields``: the JSON paths of a value that are embedded (default the whole
        value)."""
        service = self.memory(tenant_id or "default")
        return AccordStore(
            self.client, index=self._store_index(service, fields), ttl=ttl,  # type: ignore[arg-type]
            tenant_id=tenant_id, db_name=self.db_name, service=service,
        )  # fmt: skip

    def aggregator(self, config: AggregatorConfig | None = None, **kwargs: Any) -> Aggregator:
        """An outbox aggregator (long-term memory from short-term memory), set up.
        ``kwargs`` as for :class:`~accord.memory.aggregator.Aggregator`."""
        aggregator = Aggregator(
            self.client, config=self._aggregator_config(config), service=self.memory(),
            uow=self.uow, **kwargs,
        )  # fmt: skip
        aggregator.setup()
        self._consumer_registered(aggregator.config)
        return aggregator

    def background_aggregator(self, **kwargs: Any) -> BackgroundAggregator:
        """The aggregator on a background thread of this process (a context manager that
        starts and stops it); ``accord memory worker`` runs it as its own process."""
        return BackgroundAggregator(self.aggregator(**kwargs))

    def runs(self, serde: Any = None) -> RunQueue:
        """The queue of runs (submit, wait, cancel, approve, ...; docs/durable-execution.md),
        set up; values stored with ``serde`` (default LangGraph's serializer, as the
        checkpointer and ``accord worker`` use)."""
        queue = RunQueue(self.uow, self.db_name, codec=serde or JsonPlusSerializer())
        queue.setup()
        return queue

    def close(self) -> None:
        """Close the client if this root opened it."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Accord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncAccord(_Root[AsyncMemoryService, AsyncUnitOfWork]):
    """:class:`Accord` on pymongo's ``AsyncMongoClient`` (the same arguments; ``client``
    an ``AsyncMongoClient``): the async checkpointer, store and aggregator on one async
    unit of work."""

    _connect = staticmethod(connect_async)

    async def checkpointer(self, **kwargs: Any) -> AsyncAccordSaver:
        """An :class:`~accord.checkpointers.AsyncAccordSaver` on this root's unit of work,
        set up."""
        kwargs.setdefault("timeout", self.timeout)
        saver = AsyncAccordSaver(self.client, db_name=self.db_name, uow=self.uow, **kwargs)
        await saver.setup()
        self._savers.add(saver)
        return saver

    def memory_unprepared(self, tenant_id: str = "default") -> AsyncMemoryService:
        """The memory service of ``tenant_id`` on this root's kernel, not set up (its
        collections exist already)."""
        return self._services.get(tenant_id) or self._new_service(AsyncMemoryService, tenant_id)

    async def memory(self, tenant_id: str = "default") -> AsyncMemoryService:
        """The memory service of ``tenant_id`` (one per tenant), set up."""
        if tenant_id not in self._services:
            service = self._new_service(AsyncMemoryService, tenant_id)
            await service.setup()
            self._services[tenant_id] = service
        return self._services[tenant_id]

    async def store(
        self,
        tenant_id: str | None = None,
        *,
        fields: Sequence[str] | None = None,
        ttl: TTLConfig | None = None,
    ) -> AsyncAccordStore:
        """The async LangGraph store over long-term memory (the run's tenant in a run;
        see :meth:`Accord.store`)."""
        service = await self.memory(tenant_id or "default")
        return AsyncAccordStore(
            self.client, index=self._store_index(service, fields), ttl=ttl,  # type: ignore[arg-type]
            tenant_id=tenant_id, db_name=self.db_name, service=service,
        )  # fmt: skip

    async def aggregator(
        self, config: AggregatorConfig | None = None, **kwargs: Any
    ) -> AsyncAggregator:
        """An async outbox aggregator, set up. ``kwargs`` as for
        :class:`~accord.memory.aggregator.AsyncAggregator`."""
        aggregator = AsyncAggregator(
            self.client, config=self._aggregator_config(config), service=await self.memory(),
            uow=self.uow, **kwargs,
        )  # fmt: skip
        await aggregator.setup()
        self._consumer_registered(aggregator.config)
        return aggregator

    async def background_aggregator(self, **kwargs: Any) -> AsyncBackgroundAggregator:
        """The aggregator as a task on the running event loop, set up and not started:
        ``async with await app.background_aggregator() as worker: ...`` starts it and
        stops it (after its current event) on exit."""
        return AsyncBackgroundAggregator(await self.aggregator(**kwargs))

    async def runs(self, serde: Any = None) -> AsyncRunQueue:
        """:meth:`Accord.runs` on this root's async kernel."""
        queue = AsyncRunQueue(self.uow, self.db_name, codec=serde or JsonPlusSerializer())
        await queue.setup()
        return queue

    async def close(self) -> None:
        """Close the client if this root opened it."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> AsyncAccord:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
