"""The policy, enforced on every operation of every kernel: a ``check`` hook (writes) and a
``read`` hook (reads).

For each plan, before anything is sent, and for each read, before it runs:

* a principal bound to a tenant (an API key, an MCP server's principal) acts on that tenant
  only; its reads are narrowed to it as well (``tenant_id`` in the filter), so no filter a
  door builds can reach another tenant's documents;
* every group of a plan needs the actions its ops perform on the group's artifact class
  (``insert``; ``update`` for updates and replacements, both for an upsert, ``insert``
  alone for an insert-once upsert of ``$setOnInsert``; ``remove`` for deletes; ``find``
  and ``update`` for a find-and-modify), every outbox event ``insert`` on the outbox, and
  every read ``find`` on its class (and on the classes a ``$lookup``, ``$graphLookup`` or
  ``$unionWith`` of its pipeline reads).

A denial raises :class:`~accord.errors.PermissionDenied` naming the principal, the action,
the class and the rule that applied, and is counted (:class:`Denials`). Groups the
``derive`` and ``seal`` hooks add (outbox inserts, vectors, audit records) are accord's
own consequences of an operation that was allowed and are not checked again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from accord.errors import PermissionDenied
from accord.governance.audit_cuts import is_audit_cut
from accord.governance.policy import ACTIONS, UNTENANTED, Action, Policy
from accord.governance.redaction import is_image_erasure
from accord.platform.context import ADMIN, Principal
from accord.platform.hooks import ReadRequest
from accord.platform.plan import Op, Plan

_INSERT: frozenset[Action] = frozenset({"insert"})
_UPDATE: frozenset[Action] = frozenset({"update"})
_UPSERT: frozenset[Action] = frozenset({"insert", "update"})
_REMOVE: frozenset[Action] = frozenset({"remove"})
_FIND_UPDATE: frozenset[Action] = frozenset({"find", "update"})
_FIND_UPSERT: frozenset[Action] = frozenset({"find", "insert", "update"})
#: aggregation stages that read another collection, and the key naming it
_READS_OTHER = {"$lookup": "from", "$graphLookup": "from", "$unionWith": "coll"}
#: aggregation stages that write: never part of a read
_WRITES = ("$out", "$merge")


class Denials:
    """Denials counted per (principal, action, class), for every kernel of the process
    that shares this counter (Governance II audits them; ``snapshot()`` reports them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, principal: str, action: str, artifact: str) -> None:
        with self._lock:
            self._counts[(principal, action, artifact)] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._counts)


#: The process's denial counter (the default of every policy hook).
DENIALS = Denials()


def actions_of(op: Op) -> frozenset[Action]:
    """What ``op`` does, in policy actions."""
    kind = op.kind
    if kind == "insert":
        return _INSERT
    if kind in ("delete", "delete_many"):
        return _REMOVE
    if kind == "find_one_and_update":
        return _FIND_UPSERT if op.upsert else _FIND_UPDATE
    if op.upsert:
        doc = op.doc
        if kind == "update" and isinstance(doc, Mapping) and list(doc) == ["$setOnInsert"]:
            return _INSERT  # insert_once: never changes a document that exists
        return _UPSERT
    return _UPDATE


def _named(principal: Principal | None, operation: str) -> Principal:
    """The acting principal; the kernel names one before its hooks run, so an operation
    without one did not come through a kernel: refused (the policy fails closed)."""
    if principal is None:
        raise PermissionDenied(
            f"an operation without a principal ({operation or 'unnamed'}) is refused: "
            f"run it through a kernel of accord.runtime, which names who acts"
        )
    return principal


class PolicyHook:
    """The policy's ``check`` and ``read`` hook (module docstring).

    ``policy`` is enforced everywhere, unless ``stored`` is given: then each database's
    own applied policy (:class:`~accord.governance.stored.StoredPolicies`, which keeps it
    fresh through the kernel's ``refresh`` phase) is enforced on the operations of that
    database, and ``policy`` where none is stored. The checks stay pure: they ask
    ``stored`` for what it holds."""

    name = "governance-policy"

    def __init__(self, policy: Policy, denials: Denials | None = None, stored: Any = None) -> None:
        self.denials = denials if denials is not None else DENIALS
        self.stored = stored
        self._rules = _Rules(policy, self.denials)
        self._by_policy: dict[int, _Rules] = {id(policy): self._rules}
        if stored is not None:  # the kernel asks it before each operation
            self.refresh_read = stored.refresh_read
            self.refreshed = stored.refreshed

    @property
    def policy(self) -> Policy:
        """The policy enforced where no stored one applies."""
        return self._rules.policy

    def rules(self, db: str | None) -> _Rules:
        """The rules of the policy enforced on database ``db``."""
        if self.stored is None or db is None:
            return self._rules
        policy = self.stored.current(db)
        found = self._by_policy.get(id(policy))
        if found is None or found.policy is not policy:
            found = _Rules(policy, self.denials)
            if len(self._by_policy) > 64:  # old versions: built again if ever needed
                self._by_policy = {id(self._rules.policy): self._rules}
            self._by_policy[id(policy)] = found
        return found

    # -- the phases ------------------------------------------------------------------

    def check(self, plan: Plan) -> None:
        """Refuse ``plan`` unless its principal may do every op of it."""
        db = plan.groups[0].db if plan.groups else plan.events[0].db if plan.events else None
        self.rules(db).check(plan)

    def read(self, request: ReadRequest) -> ReadRequest:
        """Refuse ``request`` unless its principal may find in every class it reads; a
        tenant-bound principal's read is narrowed to its tenant."""
        return self.rules(request.db).read(request)

    def allowed(
        self, principal: Principal, artifact: str, collection: str | None, db: str | None = None
    ) -> frozenset[Action]:
        """What ``principal`` may do on ``artifact`` (in ``collection``, for business), in
        database ``db``."""
        return self.rules(db).allowed(principal, artifact, collection)


class _Rules:
    """One policy's decisions, with the grants cached per principal and class."""

    def __init__(self, policy: Policy, denials: Denials) -> None:
        self.policy = policy
        self.denials = denials
        self._allowed: dict[tuple[str, str, str, str | None], frozenset[Action]] = {}
        # collection -> class, for the collections a pipeline stage reads
        self._by_collection = {
            cls.collection: name.partition(":")[0]
            for name, cls in policy.classes.items()
            if cls.collection is not None
        }

    def check(self, plan: Plan) -> None:
        context = plan.context
        principal = _named(context.principal, context.operation)
        self._tenant(
            principal, context.tenant_id, [g.artifact for g in plan.groups], "write",
            context.operation,
        )  # fmt: skip
        for group in plan.groups:
            if group.artifact == "business":
                self._not_accords(principal, group.collection, context.operation)
            if principal.role == ADMIN and is_image_erasure(context.operation, group):
                continue  # an admin's erasure of audit images (redaction.py)
            if (
                principal.role == ADMIN
                and group.artifact == "audit"
                and is_audit_cut(context.operation, plan)
            ):
                continue  # an admin's cut of expired audit records (audit_cuts.py)
            needed: frozenset[Action] = frozenset()
            for op in group.ops:
                needed = needed | actions_of(op)
            if needed:
                self._require(principal, needed, group.artifact, group.collection,
                              context.operation)  # fmt: skip
        for event in plan.events:
            self._require(principal, _INSERT, "outbox", event.collection, context.operation)
            if event.tenant_id != context.tenant_id:  # an event for another tenant's work
                self._tenant(principal, event.tenant_id, ["outbox"], "write", context.operation)

    def read(self, request: ReadRequest) -> ReadRequest:
        context = request.context
        principal = _named(context.principal, context.operation)
        self._tenant(principal, context.tenant_id, [request.artifact], "read", context.operation)
        self._require(principal, frozenset({"find"}), request.artifact, request.collection,
                      context.operation)  # fmt: skip
        if request.pipeline:
            self._pipeline(principal, request.pipeline, context.operation)
        if principal.tenant_id is not None and request.artifact not in UNTENANTED:
            return request.narrowed({"tenant_id": principal.tenant_id})
        return request

    # -- the rules -------------------------------------------------------------------

    def allowed(
        self, principal: Principal, artifact: str, collection: str | None
    ) -> frozenset[Action]:
        """What ``principal`` may do on ``artifact`` (in ``collection``, for business)."""
        key = (
            principal.role,
            principal.name,
            artifact,
            collection if artifact == "business" else None,
        )
        found = self._allowed.get(key)
        if found is None:
            cls = self.policy.of(artifact, collection)
            found = frozenset() if cls is None else cls.allowed(principal.role, principal.name)
            if len(self._allowed) < 4096:  # bounded: names come from configuration
                self._allowed[key] = found
        return found

    def _require(
        self,
        principal: Principal,
        needed: frozenset[Action],
        artifact: str,
        collection: str | None,
        operation: str,
    ) -> None:
        allowed = self.allowed(principal, artifact, collection)
        if needed <= allowed:
            return
        action = next(a for a in ACTIONS if a in needed and a not in allowed)
        cls = self.policy.of(artifact, collection)
        label = f"business:{collection}" if artifact == "business" and collection else artifact
        rule = (
            cls.rule(principal.role, principal.name)
            if cls is not None
            else f"the policy has no class {artifact!r}, so nobody may touch it"
        )
        self.denials.add(principal.name, action, label)
        raise PermissionDenied(
            f"{principal.describe()} may not {action} {label} documents"
            f"{f' ({operation})' if operation else ''}: policy {self.policy.source}, "
            f"{rule}"
        )

    def _not_accords(self, principal: Principal, collection: str, operation: str) -> None:
        """A business write (tenant input) never lands in a collection the policy gives to
        one of accord's classes, whether or not a part has recorded it in the catalog yet
        (audit records, applied policies)."""
        owner = self._by_collection.get(collection)
        if owner is not None and owner != "business":
            self.denials.add(principal.name, "insert", f"business:{collection}")
            raise PermissionDenied(
                f"{principal.describe()} may not write business records into {collection!r}"
                f"{f' ({operation})' if operation else ''}: it is accord's {owner} "
                f"collection (policy {self.policy.source}, [classes.{owner}])"
            )

    def _tenant(
        self,
        principal: Principal,
        tenant_id: str,
        artifacts: Iterable[str],
        what: str,
        operation: str,
    ) -> None:
        bound = principal.tenant_id
        if bound is None or tenant_id == bound:
            return
        if tenant_id == "*" and all(a in UNTENANTED for a in artifacts):
            return  # accord's own bookkeeping, which holds no tenant's data
        self.denials.add(principal.name, what, f"tenant:{tenant_id}")
        raise PermissionDenied(
            f"{principal.describe()} acts for tenant {bound!r} only and may not {what} "
            f"tenant {tenant_id!r}'s data{f' ({operation})' if operation else ''}"
        )

    def _pipeline(
        self, principal: Principal, pipeline: Sequence[Mapping[str, Any]], operation: str
    ) -> None:
        for stage in pipeline:
            for name, spec in stage.items():
                if name in _WRITES:
                    self.denials.add(principal.name, "write", name)
                    raise PermissionDenied(
                        f"{principal.describe()}: a read may not write ({name} stage)"
                    )
                key = _READS_OTHER.get(name)
                if key is not None and principal.tenant_id is not None:
                    # its read is narrowed to its tenant by a leading $match; what a join
                    # or union brings in is not
                    self.denials.add(principal.name, "read", name)
                    raise PermissionDenied(
                        f"{principal.describe()} acts for tenant {principal.tenant_id!r} "
                        f"only: a read may not bring in other documents ({name} stage)"
                    )
                if key is not None and isinstance(spec, str):  # {$unionWith: "coll"}
                    spec = {key: spec}
                if key is None or not isinstance(spec, Mapping):
                    if name == "$facet" and isinstance(spec, Mapping):
                        for sub in spec.values():
                            self._pipeline(principal, sub, operation)
                    continue
                target = spec.get(key)
                artifact = self._by_collection.get(target) if isinstance(target, str) else None
                self._require(principal, frozenset({"find"}), artifact or "business",
                              target if isinstance(target, str) else None, operation)  # fmt: skip
                inner = spec.get("pipeline")
                if isinstance(inner, list):
                    self._pipeline(principal, inner, operation)
