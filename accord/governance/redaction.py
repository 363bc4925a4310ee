"""The one change the audit trail allows: an erasure replacing the images of records.

``full`` audit records keep the images (filter, change, after image) of each op as text,
outside the hashed body and covered by their hashes in ``ops`` (docs/governance.md,
"Audit trail"). A data subject's erasure must not leave the subject's data there, and
the chain must still verify: so the erasure sets each image of a record that held the
subject's data to ``None``, keeping its hash, and marks the entry ``erased`` (when).

Both the policy hook (nobody but this may change an audit record, and only an admin may
do this) and the audit hook (which refuses every other write to its collections) ask
:func:`is_image_erasure`, which accepts exactly that shape and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from bson import ObjectId

from accord.platform.artifacts import AUDIT
from accord.platform.context import WriteContext
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "ERASE_OPERATION", "erase_images", "erased_images", "image_erasure_op", "is_image_erasure",
]  # fmt: skip

#: The operation of every plan of an erasure (``WriteContext.operation``).
ERASE_OPERATION = "governance.erase"
_ERASED_ENTRY = frozenset({"filter", "change", "image", "erased"})


def erased_images(count: int, at: datetime) -> list[dict[str, Any]]:
    """``count`` image entries with nothing but their erasure time."""
    return [{"filter": None, "change": None, "image": None, "erased": at} for _ in range(count)]


def image_erasure_op(record_id: ObjectId, count: int, at: datetime) -> Op:
    """The op that erases the ``count`` images of audit record ``record_id``."""
    return Op("update", {"_id": record_id}, {"$set": {"images": erased_images(count, at)}})


def _erased_entry(entry: Any) -> bool:
    return (
        isinstance(entry, Mapping)
        and set(entry) == _ERASED_ENTRY
        and entry["filter"] is None
        and entry["change"] is None
        and entry["image"] is None
        and isinstance(entry["erased"], datetime)
    )


def is_image_erasure(operation: str, group: Group) -> bool:
    """Whether ``group`` (of a plan with ``operation``) only erases images of audit
    records, op by op as :func:`image_erasure_op` builds them."""
    if operation != ERASE_OPERATION or group.artifact != "audit" or not group.ops:
        return False
    for op in group.ops:
        if op.kind != "update" or op.upsert or not isinstance(op.doc, Mapping):
            return False
        filt = op.filter or {}
        if set(filt) != {"_id"} or not isinstance(filt["_id"], ObjectId):
            return False
        if set(op.doc) != {"$set"} or not isinstance(op.doc["$set"], Mapping):
            return False
        change = op.doc["$set"]
        if set(change) != {"images"} or not isinstance(change["images"], list):
            return False
        if not all(_erased_entry(e) for e in change["images"]):
            return False
    return True


def erase_images(
    uow: Any, db: str, records: str, filt: Mapping[str, Any], at: datetime,
    progress: Callable[[str, int], None] | None = None,
) -> int:  # fmt: skip
    """Erase the images of the audit records of ``db`` (collection ``records``) matching
    ``filt`` that still have any, a page at a time, per tenant, through ``uow`` (a sync
    kernel acting as an admin, operation :data:`ERASE_OPERATION`). Returns how many
    records changed."""
    from accord.governance.subjects import pages  # (subjects -> policy; no cycle at import)

    changed = 0
    for docs in pages(uow, AUDIT.name, db, records, {"images": {"$exists": True}, **filt},
                      projection={"images.erased": 1, "tenant_id": 1},
                      operation=ERASE_OPERATION):  # fmt: skip
        by_tenant: dict[str, list[Op]] = {}
        for d in docs:
            images = d.get("images") or []  # one {} (or {erased}) per image entry
            if all(isinstance(i, dict) and "erased" in i for i in images):
                continue  # erased already
            by_tenant.setdefault(str(d.get("tenant_id")), []).append(
                image_erasure_op(d["_id"], len(images), at)
            )
        for tenant, ops in sorted(by_tenant.items()):
            context = WriteContext(tenant, principal=uow.principal, operation=ERASE_OPERATION)
            uow.execute(Plan(context, [Group("erase:audit-images", db, records, AUDIT.name, ops)]))
            changed += len(ops)
            if progress is not None:
                progress("audit images", len(ops))
    return changed
