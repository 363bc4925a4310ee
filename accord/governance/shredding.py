"""Crypto-shredding: destroying data keys, so every copy of what they encrypted (backups,
exports, a stolen disk) becomes unreadable.

* :func:`destroy_subject_keys`: the keys of a data subject's threads and of the
  subject's own values (``accord governance erase``, before the documents are deleted,
  so a run of the erasure interrupted after this step still finds the threads);
  :func:`thread_keys_naming` lists the thread keys it would destroy by the subject
  (those of threads deleted before included), so the erasure can check their holds;
* :func:`shred_tenant`: every key of a tenant (``accord governance shred-tenant``);
* and, not a shredding, :func:`rewrap_keys`: the master key's rotation (every data key
  re-wrapped under the current master key, ``accord governance rewrap-keys``).

A key document is deleted by ``_id`` through the kernel (operation ``governance.erase``,
the caller's principal), so each deletion is an audit record like any other write, and
the filter holds no identifier. Other processes forget a destroyed key within their key
cache's lifetime (10 s by default; :class:`~accord.governance.encryption.EncryptionHook`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from accord.errors import InvalidInputError, LegalHoldError
from accord.governance.audit_records import RECORDS
from accord.governance.crypto import MasterKey
from accord.governance.encryption import keys_collection
from accord.governance.holding import list_holds
from accord.governance.holds import Hold
from accord.governance.policy import Policy
from accord.governance.redaction import ERASE_OPERATION, erase_images
from accord.governance.subjects import chunks, find_subject, pages, subject_values
from accord.platform.artifacts import ENCRYPTION_KEY
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "PAGE", "destroy_keys", "destroy_subject_keys", "rewrap_keys", "shred_tenant",
    "thread_keys_naming",
]  # fmt: skip

#: Keys read and destroyed per page, and the most thread ids one filter lists.
PAGE = 1000


def destroy_keys(uow: Any, db: str, policy: Policy, where: Mapping[str, Any]) -> int:
    """Delete the key documents of ``db`` matching ``where`` (read through the kernel,
    deleted by ``_id``, per tenant, in pages), and the audit images of every record of
    theirs (a ``full`` trail kept a wrapped key there, which the master key still
    unwraps; the audit records keys in ``metadata`` at most since 2026-12-07). Returns
    how many were destroyed."""
    coll = keys_collection(policy)
    destroyed = 0
    at = datetime.now(UTC)
    while True:
        docs = uow.find(ReadContext("*", operation=ERASE_OPERATION), ENCRYPTION_KEY.name, db,
                        coll, dict(where), projection={"_id": 1, "tenant_id": 1},
                        sort=[("_id", 1)], limit=PAGE)  # fmt: skip
        if not docs:
            return destroyed
        by_tenant: dict[str, list[Any]] = {}
        for d in docs:
            by_tenant.setdefault(str(d.get("tenant_id")), []).append(d["_id"])
        for tenant, ids in sorted(by_tenant.items()):
            group = Group("erase:encryption_key", db, coll, ENCRYPTION_KEY.name,
                          [Op("delete_many", {"tenant_id": tenant, "_id": {"$in": ids}})])  # fmt: skip
            context = WriteContext(tenant, principal=uow.principal, operation=ERASE_OPERATION)
            result = uow.execute(Plan(context, [group]))
            erase_images(uow, db, RECORDS, {"tenant_id": tenant, "collection": coll,
                                            "ops.doc_id": {"$in": ids}}, at)  # fmt: skip
            # what the delete deleted: a key destroyed meanwhile by another is not ours
            destroyed += result[group.name].deleted
        if len(docs) < PAGE:
            return destroyed


def destroy_subject_keys(
    uow: Any,
    db: str,
    policy: Policy,
    subject: str,
    threads: Iterable[tuple[str, str]],
    tenant_id: str | None = None,
) -> int:
    """Destroy the keys of ``threads`` ((tenant, thread) pairs: the subject's), of the
    threads whose writes named the subject (``subjects``: a thread deleted before the
    erasure, which no document finds any more, whose backups its key still opens), and
    those of the subject's own values (a scalar subject field equal to ``subject``, or a
    list such as a memory namespace holding it; any of
    :func:`~accord.governance.subjects.subject_values`), in ``tenant_id`` only when
    given."""
    destroyed = 0
    by_tenant: dict[str, list[str]] = {}
    for tenant, thread in threads:
        by_tenant.setdefault(tenant, []).append(thread)
    for tenant, names in sorted(by_tenant.items()):
        for part in chunks(sorted(names), PAGE):
            where = {"tenant_id": tenant, "scope": "thread", "thread_id": {"$in": part}}
            destroyed += destroy_keys(uow, db, policy, where)
    values = list(subject_values(subject))
    named: dict[str, Any] = {"$or": [{"scope": "subject", "subject": {"$in": values}},
                                     {"scope": "thread", "subjects": {"$in": values}}]}  # fmt: skip
    if tenant_id is not None:
        named["tenant_id"] = tenant_id
    return destroyed + destroy_keys(uow, db, policy, named)


def thread_keys_naming(
    uow: Any, db: str, policy: Policy, subject: str, tenant_id: str | None = None
) -> dict[tuple[str, str], set[Any]]:
    """(tenant, thread) -> the subjects its key names, of every thread key whose
    ``subjects`` name ``subject`` (in ``tenant_id`` only when given): the keys
    :func:`destroy_subject_keys` destroys by the subject, whose threads may have been
    deleted before (a legal hold on such a thread keeps its key: the erasure checks)."""
    where: dict[str, Any] = {"scope": "thread", "subjects": {"$in": list(subject_values(subject))}}
    if tenant_id is not None:
        where["tenant_id"] = tenant_id
    out: dict[tuple[str, str], set[Any]] = {}
    for docs in pages(uow, ENCRYPTION_KEY.name, db, keys_collection(policy), where,
                      projection={"tenant_id": 1, "thread_id": 1, "subjects": 1},
                      operation=ERASE_OPERATION):  # fmt: skip
        for d in docs:
            names = d.get("subjects")
            pair = (str(d.get("tenant_id")), str(d.get("thread_id")))
            out.setdefault(pair, set()).update(names if isinstance(names, list) else ())
    return out


def shred_tenant(uow: Any, db: str, policy: Policy, tenant_id: str) -> int:
    """Destroy every data key of ``tenant_id`` in ``db``: all its encrypted payloads, in
    the database and in every copy, become unreadable (its documents are not deleted).
    Refused with :class:`~accord.errors.LegalHoldError`, nothing destroyed, while a legal
    hold covers the tenant or anything in it."""
    for hold in list_holds(uow, db, policy):
        if _covers_tenant(uow, db, policy, hold, tenant_id):
            raise LegalHoldError(
                f"tenant {tenant_id!r} is under legal hold in {db}: {hold.describe()}"
                + (f" (reason {hold.reason!r})" if hold.reason else "")
                + ". No key was destroyed; release the hold when the case allows "
                "(accord governance release) and shred again",
                hold=hold.describe(),
                hold_id=hold.id,
            )
    return destroy_keys(uow, db, policy, {"tenant_id": tenant_id})


def _covers_tenant(uow: Any, db: str, policy: Policy, hold: Hold, tenant_id: str) -> bool:
    """Whether ``hold`` covers anything a shredding of ``tenant_id`` makes unreadable:
    the tenant, anything in it, and the holds of every tenant (no ``tenant_id``) on an
    encrypted class, on the keys, or on a subject with data in the tenant."""
    if (hold.kind == "tenant" and hold.value == tenant_id) or hold.tenant_id == tenant_id:
        return True
    if hold.tenant_id is not None:
        return False
    if hold.kind == "class":
        cls = policy.classes.get(hold.value)
        return hold.value == ENCRYPTION_KEY.name or (cls is not None and cls.encryption != "off")
    if hold.kind == "subject":
        try:
            found = find_subject(uow, db, policy, hold.value, tenant_id)
        except InvalidInputError:  # a value that is no identifier any more: held
            return True
        return bool(found.threads) or any(t.count() for t in found.targets.values())
    return False


def rewrap_keys(uow: Any, db: str, policy: Policy, master: MasterKey) -> int:
    """Re-wrap every data key of ``db`` not wrapped under ``master`` (the current master
    key; its ``previous`` unwraps them), so the previous master key can be retired. Each
    key document is compare-and-set on its ``kid`` and old fingerprint (a key destroyed
    meanwhile stays destroyed), through the kernel. Returns how many were re-wrapped."""
    coll = keys_collection(policy)
    done = 0
    while True:
        docs = uow.find(ReadContext("*", operation="encryption.rewrap"), ENCRYPTION_KEY.name,
                        db, coll, {"master": {"$ne": master.fingerprint}},
                        sort=[("_id", 1)], limit=PAGE)  # fmt: skip
        if not docs:
            return done
        by_tenant: dict[str, list[Op]] = {}
        for d in docs:
            key = master.unwrap(d)
            wrapped = master.wrap(str(d["kid"]), str(d["tenant_id"]), key)
            by_tenant.setdefault(str(d["tenant_id"]), []).append(
                Op(
                    "update",
                    {"_id": d["_id"], "kid": d["kid"], "master": d.get("master")},
                    {"$set": {"wrapped": wrapped, "master": master.fingerprint}},
                )  # fmt: skip
            )
        for tenant, ops in sorted(by_tenant.items()):
            group = Group("rewrap:encryption_key", db, coll, ENCRYPTION_KEY.name, ops)
            uow.execute(Plan(WriteContext(tenant, principal=uow.principal,
                                          operation="encryption.rewrap"), [group]))  # fmt: skip
            done += len(ops)
