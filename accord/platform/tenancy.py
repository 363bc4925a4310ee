"""Tenant isolation of writes made from tenant input: a unit-of-work hook.

Documents of every artifact class carry ``tenant_id``. Most plans are built by accord's
own code from validated identifiers; some carry what a tenant wrote (a node's business
writes: filters, update operators, replacement documents). For groups of such classes
(``ArtifactClass.tenant_writable``) this hook checks, before anything is sent, that no op
can reach or produce a document of another tenant:

* every filter pins ``tenant_id`` to the plan's tenant as a plain string (no operator);
* no filter or pipeline runs server-side JavaScript (``$where``, ``$function``,
  ``$accumulator``);
* inserted and replacement documents carry exactly the plan's tenant;
* no update changes or removes ``tenant_id``: no operator names it as a path (``$set``,
  ``$unset``, ``$rename`` source or target, ``$setOnInsert``...), and pipeline updates
  are limited to ``$set``/``$addFields``/``$unset`` stages that do not name it (a
  ``$project``/``$replaceRoot``/``$replaceWith`` stage could drop or rewrite it).

An upsert's new document takes ``tenant_id`` from the filter's equality, so it lands in
the plan's tenant. A refusal raises :class:`~accord.errors.InvalidInputError` naming the
collection and the reason; nothing of the plan is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accord.errors import InvalidInputError
from accord.platform.artifacts import CLASSES
from accord.platform.plan import Op, Plan

TENANT_FIELD = "tenant_id"

#: Operators that run JavaScript on the server: tenant input never does (it would spend
#: the database's CPU, or sleep holding a transaction, for every tenant).
_SERVER_JS = frozenset({"$where", "$function", "$accumulator"})
_NO_JS = "server-side JavaScript, which writes from tenant input may not run"

#: Pipeline-update stages that can neither drop nor rewrite fields they do not name.
_SAFE_PIPELINE_STAGES = frozenset({"$set", "$addFields", "$unset"})


class TenantGuard:
    """Refuses plans whose tenant-writable groups could cross tenants (see module doc)."""

    name = "tenancy"

    def check(self, plan: Plan) -> None:
        tenant = plan.context.tenant_id
        for group in plan.groups:
            cls = CLASSES.get(group.artifact)
            if cls is None or not cls.tenant_writable:
                continue
            for index, op in enumerate(group.ops):
                problem = op_problem(op, tenant)
                if problem is not None:
                    raise InvalidInputError(
                        f"refused write #{index} to {group.collection!r} for tenant "
                        f"{tenant!r}: {problem}. Writes from tenant input may only touch "
                        f"the tenant's own documents and never change {TENANT_FIELD!r}."
                    )


def op_problem(op: Op, tenant: str) -> str | None:
    """Why ``op`` could cross tenants, or None when it cannot."""
    if op.kind == "insert":
        return _doc_problem(op.doc, tenant, "the inserted document")
    if not isinstance(op.filter, Mapping) or op.filter.get(TENANT_FIELD) != tenant:
        return f"its filter must pin {TENANT_FIELD!r} to {tenant!r} (as a plain string)"
    script = _javascript(op.filter)
    if script is not None:
        return f"its filter uses {script}, {_NO_JS}"
    if op.kind == "replace":
        return _doc_problem(op.doc, tenant, "the replacement document")
    if op.kind in ("update", "update_many"):
        if isinstance(op.doc, Mapping):
            return _operators_problem(op.doc)
        if isinstance(op.doc, Sequence) and not isinstance(op.doc, str | bytes):
            script = _javascript(op.doc)
            if script is not None:
                return f"its pipeline uses {script}, {_NO_JS}"
            return _pipeline_problem(op.doc)
        return "the update must be an operator document or a pipeline"
    return None  # delete / delete_many: the filter check is enough


def _javascript(value: Any) -> str | None:
    """The first server-side JavaScript operator anywhere in ``value`` (a filter or a
    pipeline: both are evaluated, unlike an operator update's values), or None.
    Iterative: no nesting exhausts the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, child in item.items():
                if key in _SERVER_JS:
                    return str(key)
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def _doc_problem(doc: Any, tenant: str, what: str) -> str | None:
    if not isinstance(doc, Mapping):
        return f"{what} must be a document"
    if doc.get(TENANT_FIELD) != tenant:
        return f"{what} must carry {TENANT_FIELD!r} = {tenant!r}, not {doc.get(TENANT_FIELD)!r}"
    return None


def _touches(path: Any) -> bool:
    """Whether a field path names ``tenant_id`` or something inside it."""
    if not isinstance(path, str):
        return True  # not a path at all: refuse rather than guess
    head = path.split(".", 1)[0]
    return head == TENANT_FIELD


def _operators_problem(update: Mapping[str, Any]) -> str | None:
    for operator, arg in update.items():
        if not isinstance(operator, str) or not operator.startswith("$"):
            return f"update key {operator!r} is not an update operator"
        if not isinstance(arg, Mapping):
            return f"{operator} takes a document of field paths"
        for path, value in arg.items():
            if _touches(path):
                return f"{operator} names {path!r}"
            if operator == "$rename" and _touches(value):
                return f"$rename moves {path!r} onto {value!r}"
    return None


def _pipeline_problem(stages: Sequence[Any]) -> str | None:
    for stage in stages:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            return "each pipeline stage must be a document with one stage operator"
        (name, arg), *_ = stage.items()
        if name not in _SAFE_PIPELINE_STAGES:
            return (
                f"pipeline stage {name!r} may rewrite or drop fields; use "
                f"{sorted(_SAFE_PIPELINE_STAGES)}"
            )
        if name == "$unset":
            paths = [arg] if isinstance(arg, str) else arg
            if not isinstance(paths, list) or any(_touches(p) for p in paths):
                return f"$unset names {arg!r}"
        elif not isinstance(arg, Mapping) or any(_touches(p) for p in arg):
            return f"{name} names {TENANT_FIELD!r} or is not a document of fields"
    return None
