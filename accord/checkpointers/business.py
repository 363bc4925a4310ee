"""Business writes: stage inserts/updates/deletes inside a node; they commit with the task.

Inside a LangGraph node (sync or async)::

    from accord.checkpointers import business

    def place_order(state):
        business.insert_one("orders", {"_id": state["order_id"], "total": 42})
        business.update_one("inventory", {"sku": "A-1"}, {"$inc": {"qty": -1}})
        return {"messages": [AIMessage("Order placed.")]}

Nothing is written when these functions return. The staged operations travel with the
task's own writes (LangGraph's per-task write buffer, found through the node's runnable
config, i.e. a context variable), and the saver applies them in the same transaction that
records the task as finished (``put_writes``). Consequences:

* parallel tasks never see each other's staged writes; async nodes work the same way;
* a retried attempt starts with an empty buffer (LangGraph clears it), a failed or
  interrupted task commits none of its business writes;
* a task that was already recorded (a replayed ``put_writes``, a resumed thread) is not
  applied twice: exactly once per task, as long as the task's writes are committed;
* staged writes are invisible (to the node too) until the transaction commits.

**Versioned records** (agents sharing a business object): every business write keeps an
integer ``_version`` on the record (an insert sets 1, an update adds 1, a replacement
with ``expect_version=n`` sets n + 1, one without a fresh random value). Read it with the
record and pass it back: ``update_one(..., expect_version=n)`` (``replace_one`` and
``delete_one`` too) commits only if the record is still at version ``n``; otherwise the
task's transaction fails with :class:`~accord.errors.VersionConflict` (nothing of the task
is committed) and resuming the thread re-runs the task on the record as it is now, instead
of overwriting another agent's change. ``expect_version=0`` means "a record no accord
write has versioned yet". Compare versions for equality only; ``_version`` is accord's:
staged writes may not set it.

Documents get the run's ``tenant_id`` and filters are scoped to it; no update may change
or remove ``tenant_id`` (operators naming it, ``$rename`` onto or from it, pipeline
stages that could drop it are refused when staged). Staging requires
the graph to be compiled with an accord saver and ``durability`` ``"sync"`` or
``"async"`` (LangGraph's default); under ``"exit"`` LangGraph never records tasks
individually, so staging raises instead of silently dropping writes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import bson
from bson.errors import InvalidDocument
from langgraph.config import get_config

from accord.checkpointers import langgraph_internals
from accord.checkpointers.plans import APPEND_EVENT, VERSION_FIELD, bookkeeping_problem
from accord.checkpointers.staged import tenancy_problem
from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.checkpointers.validation import collection_name, identifier, nested_deeper
from accord.errors import ConfigurationError, InvalidInputError
from accord.platform import workflow_log

_SEND = langgraph_internals.CONFIG_SEND
_CHECKPOINTER = langgraph_internals.CONFIG_CHECKPOINTER
_DURABILITY = langgraph_internals.CONFIG_DURABILITY
_RUNTIME = langgraph_internals.CONFIG_RUNTIME

__all__ = [
    "BUSINESS_CHANNEL", "aread_events", "append_event", "delete_one", "insert_one",
    "read_events", "replace_one", "update_one",
]  # fmt: skip


def insert_one(collection: str, document: Mapping[str, Any]) -> None:
    """Stage an insert of ``document`` into business collection ``collection``."""
    _stage("insert_one", collection, document=_document(document, "document"))


def update_one(
    collection: str,
    filter: Mapping[str, Any],
    update: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    upsert: bool = False,
    expect_version: int | None = None,
) -> None:
    """Stage ``update_one(filter, update, upsert=upsert)``; ``update`` uses operators ($set,
    $inc...) or is a pipeline. ``expect_version``: commit only if the record is at that
    version (module docstring)."""
    if isinstance(update, Mapping):
        if not update or not all(isinstance(k, str) and k.startswith("$") for k in update):
            raise InvalidInputError(
                "update must be a non-empty operator document such as {'$set': {...}}."
            )
        update_doc: Any = _copy(dict(update), "update")
    elif isinstance(update, Sequence) and not isinstance(update, str | bytes):
        if not all(isinstance(stage, Mapping) for stage in update):
            raise InvalidInputError("each stage of a pipeline update must be a dict.")
        update_doc = _copy([dict(stage) for stage in update], "update")
    else:
        raise InvalidInputError(
            "update must be an operator document or an aggregation pipeline list."
        )
    _stage(
        "update_one",
        collection,
        filter=_document(filter, "filter"),
        update=update_doc,
        upsert=bool(upsert),
        **_expected(expect_version, upsert),
    )


def replace_one(
    collection: str,
    filter: Mapping[str, Any],
    replacement: Mapping[str, Any],
    *,
    upsert: bool = False,
    expect_version: int | None = None,
) -> None:
    """Stage ``replace_one(filter, replacement, upsert=upsert)``. ``expect_version``:
    commit only if the record is at that version (module docstring)."""
    doc = _document(replacement, "replacement")
    if any(isinstance(k, str) and k.startswith("$") for k in doc):
        raise InvalidInputError("replacement must be a document, not an update with operators.")
    _stage(
        "replace_one",
        collection,
        filter=_document(filter, "filter"),
        document=doc,
        upsert=bool(upsert),
        **_expected(expect_version, upsert),
    )


def delete_one(
    collection: str, filter: Mapping[str, Any], *, expect_version: int | None = None
) -> None:
    """Stage ``delete_one(filter)``. ``expect_version``: delete only if the record is at
    that version (module docstring)."""
    _stage(
        "delete_one",
        collection,
        filter=_document(filter, "filter"),
        **_expected(expect_version, False),
    )


def append_event(workflow: str, event: Mapping[str, Any]) -> None:
    """Stage an event for the shared log of ``workflow`` (module docstring): committed
    with the task, numbered in commit order (``seq`` 1, 2, 3... per workflow of the run's
    tenant). ``event`` is a small document (at most 64 KiB of BSON)."""
    _stage(
        APPEND_EVENT,
        workflow_log.COLLECTION,
        workflow=workflow_log.workflow_name(workflow),
        event=_document(event, "event"),
    )


def read_events(workflow: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """The committed events of ``workflow`` (the run's tenant) with ``seq > after``, in
    order, at most ``limit`` (1..1000): each ``{"seq", "event", "thread_id", "node",
    "at"}``. Inside a node of a graph compiled with an accord saver (sync nodes)."""
    config, _, _, saver = _node_context()
    return saver.read_workflow_events(config, workflow, after=after, limit=limit)  # type: ignore[no-any-return]


async def aread_events(workflow: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """:func:`read_events` for async nodes."""
    config, _, _, saver = _node_context()
    return await saver.aread_workflow_events(config, workflow, after=after, limit=limit)  # type: ignore[no-any-return]


def _expected(version: Any, upsert: bool) -> dict[str, int]:
    """The staged op's ``expect_version`` field, validated."""
    if version is None:
        return {}
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidInputError(
            f"expect_version must be a non-negative int (the record's _version as read), "
            f"got {version!r}."
        )
    if upsert:
        raise InvalidInputError(
            "expect_version and upsert=True do not go together: expect_version says the "
            "record exists at that version; create records with insert_one."
        )
    return {"expect_version": version}


#: Nesting MongoDB stores at most (and deeper input would exhaust Python's stack when
#: copied): refused when staged, with a clear error, rather than failing the task later.
MAX_DEPTH = 180


def _document(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{name} must be a dict, got {type(value).__name__}.")
    return _copy(dict(value), name)  # type: ignore[no-any-return]


def _copy(value: Any, name: str) -> Any:
    """A deep copy of ``value`` (the node may keep mutating its objects after staging
    them), refused with InvalidInputError when MongoDB could not store it: nested over
    :data:`MAX_DEPTH` levels, keys that are not strings, values BSON has no type for."""
    if nested_deeper(value, MAX_DEPTH):
        raise InvalidInputError(
            f"{name} is nested more than {MAX_DEPTH} levels deep (MongoDB's limit); "
            f"nothing was staged."
        )
    try:
        bson.encode({"v": value})
    except UnicodeEncodeError:  # BSON strings are UTF-8: no lone surrogate ("\ud800")
        raise InvalidInputError(
            f"{name} cannot be stored by MongoDB: a string in it holds a lone surrogate "
            f"(strings must be valid Unicode); nothing was staged."
        ) from None
    except (InvalidDocument, TypeError, OverflowError) as exc:
        raise InvalidInputError(
            f"{name} cannot be stored by MongoDB ({str(exc)[:200]}); nothing was staged."
        ) from None
    return copy.deepcopy(value)


def _stage(kind: str, collection: str, **fields: Any) -> None:
    config, conf, send, saver = _node_context()
    if kind == APPEND_EVENT:
        name = collection
        tenant = saver.tenant_of(config)
        thread = conf.get("thread_id")
        node_name = (config.get("metadata") or {}).get("langgraph_node")
        fields["document"] = workflow_log.event_doc(
            tenant, fields.pop("workflow"), fields.pop("event"),
            thread_id=thread if isinstance(thread, str) else None,
            node=node_name if isinstance(node_name, str) else None,
        )  # fmt: skip
    else:
        name = collection_name(collection, saver.reserved_collections())
    _send(config, conf, send, saver, kind, name, fields)


def _node_context() -> tuple[Any, dict[str, Any], Any, Any]:
    """(config, configurable, send, saver) of the running node, or ConfigurationError."""
    try:
        config = get_config()
    except RuntimeError:
        raise ConfigurationError(
            "business writes can only be staged inside a running LangGraph node "
            "(no runnable config in this context)."
        ) from None
    conf = config.get("configurable") or {}
    send = conf.get(_SEND)
    if send is None:
        raise ConfigurationError(
            "business writes can only be staged inside a running LangGraph node."
        )
    saver = conf.get(_CHECKPOINTER)
    from accord.checkpointers.base import AccordBase  # local import: base imports storage

    if not isinstance(saver, AccordBase):
        raise ConfigurationError(
            "business writes commit in the checkpointer's transaction: compile the graph with "
            "accord's AccordSaver / AsyncAccordSaver (got "
            f"{type(saver).__name__ if saver is not None else 'no checkpointer'})."
        )
    if conf.get(_DURABILITY, "async") == "exit":
        raise ConfigurationError(
            "business writes need durability='sync' or 'async': with durability='exit' "
            "LangGraph does not record tasks one by one, so staged writes would be lost."
        )
    return config, conf, send, saver


def _send(
    config: Any, conf: dict[str, Any], send: Any, saver: Any, kind: str, name: str,
    fields: dict[str, Any],
) -> None:  # fmt: skip
    """Check a staged op and put it on the task's writes."""
    tenant = saver.tenant_of(config)
    op: dict[str, Any] = {"op": kind, "collection": name, **fields}
    node = (config.get("metadata") or {}).get("langgraph_node")
    if isinstance(node, str):
        op["node"] = node  # named in the error if the database refuses this write
    if "document" in op:
        doc = op["document"]
        if doc.setdefault("tenant_id", tenant) != tenant:
            raise InvalidInputError(
                f"document tenant_id {doc['tenant_id']!r} differs from the run's tenant {tenant!r}."
            )
    if "filter" in op:
        op["filter"]["tenant_id"] = tenant
    identifier(tenant, "tenant_id")
    if bookkeeping_problem(op):
        raise InvalidInputError(
            f"business {kind} on {name!r} refused: {bookkeeping_problem(op)}. "
            f"{VERSION_FIELD!r} and 'held_expire_at' are kept by accord (pass "
            f"expect_version= to check the version; a legal hold keeps the expiry)."
        )
    # refused here, in the node, rather than when the task's writes are committed
    problem = tenancy_problem(op, tenant)
    if problem is not None:
        raise InvalidInputError(
            f"business {kind} on {name!r} refused: {problem}. Business writes may only touch "
            f"the run's tenant's documents and never change 'tenant_id'."
        )
    info = getattr(conf.get(_RUNTIME), "execution_info", None)
    if info is not None and isinstance(conf.get("thread_id"), str):
        saver.note_staged(config, info.checkpoint_id, info.task_id)
    send([(BUSINESS_CHANNEL, op)])
