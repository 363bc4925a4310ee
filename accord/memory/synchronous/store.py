# Generated from accord/memory/asynchronous/store.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""LangGraph ``BaseStore`` on accord's memory service.

``AccordStore`` is native async on pymongo's ``MongoClient``; ``AccordStore``
(:mod:`accord.memory.synchronous.store`) is its sync twin. Use either as
``graph.compile(store=...)`` and from ``get_store()`` in nodes::

    async with AccordStore.from_conn_string(uri, index={"dims": 1024,
                                                   "embed": "voyage:voyage-3.5"}) as store:
        graph = builder.compile(store=store)

Semantics follow BaseStore as InMemoryStore and PostgresStore implement it (LangGraph's own
store tests run against this class): reads in a batch see the state before the batch's
puts; the last put of a key in a batch wins; search with a query ranks by vector similarity
(scores normalised to [0, 1] as Atlas does), then fills with items that have no embedding;
TTL in minutes with ``refresh_on_read``. Each indexed field path of an item (IndexConfig
``fields``, or the put's ``index=[...]``; ``$`` paths and wildcards such as ``a[*].b`` give a
text per match) is embedded separately, and a search scores the item by its best field, as
InMemoryStore and PostgresStore do.

Generated from ``accord/memory/asynchronous/store.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path
from pymongo import MongoClient

from accord.errors import InvalidInputError
from accord.memory import model, validation
from accord.memory.conventions import RunTenants, ServesAsyncCalls, ServesSyncCalls
from accord.memory.embedders import Embedder, LangChainEmbedder
from accord.memory.model import Memory, PutRequest
from accord.memory.synchronous.service import MemoryService
from accord.platform.connection import client_options

log = logging.getLogger("accord.memory.store")
_IS_SYNC = True


def _embedder_for(index: IndexConfig | None) -> Any:
    if not index:
        return None
    if "dims" not in index or not isinstance(index["dims"], int):
        raise InvalidInputError("IndexConfig needs 'dims' (an integer)")
    embed = index.get("embed")
    if embed is None:
        return None
    if isinstance(embed, str) and (
        embed.startswith(("voyage:", "local:")) or embed in ("hashing", "local")
    ):
        return embed
    if isinstance(embed, Embedder):  # accord's own (HashingEmbedder(), ...): used as it is
        # (LangGraph's ensure_embeddings took it for a function: "not callable" at the
        # first put)
        if embed.dims is not None and embed.dims != index["dims"]:
            raise InvalidInputError(
                f"IndexConfig 'dims' is {index['dims']}, its embedder makes vectors of {embed.dims}"
            )
        return embed
    return LangChainEmbedder(ensure_embeddings(embed), dims=index["dims"])


# What differs between the twins (serving the other calling convention, the TTL sweeper's
# thread or task) lives in accord.memory.conventions, which the generator does not touch.
_Conventions = ServesAsyncCalls if _IS_SYNC else ServesSyncCalls


class AccordStore(_Conventions, BaseStore):  # type: ignore[misc,valid-type]
    """A LangGraph store whose items are accord long-term memories of one tenant.

    Inside a run (a node's ``get_store()``), the store serves the run's tenant
    (``config["configurable"]["tenant_id"]``, as the checkpointer does). ``tenant_id``
    given: the store serves only that tenant, and a run of another tenant is refused.
    Not given: ``"default"`` outside runs.
    """

    supports_ttl = True

    def __init__(
        self,
        client: MongoClient[Any],
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        tenant_id: str | None = None,
        db_name: str = "accord",
        service: MemoryService | None = None,
        conn_string: str | None = None,
    ) -> None:
        self.client = client
        self.conn_string = conn_string
        #: the event loop the store serves (sync calls from other threads run on it)
        self.loop: asyncio.AbstractEventLoop | None = None
        if not _IS_SYNC:
            with suppress(RuntimeError):
                self.loop = asyncio.get_running_loop()
        self.index_config = index
        for name in ("default_ttl", "sweep_interval_minutes"):
            validation.check_ttl((ttl or {}).get(name), f"ttl.{name}")
        self.ttl_config = ttl
        dims = index["dims"] if index else None
        #: the service of the store's own tenant (outside runs, and when pinned)
        self.own_service: MemoryService = service or MemoryService(
            client, tenant_id=tenant_id or "default", db_name=db_name,
            embedder=_embedder_for(index), dims=dims,
        )  # fmt: skip
        if tenant_id is not None and tenant_id != self.own_service.tenant_id:
            raise InvalidInputError(
                f"tenant_id {tenant_id!r} differs from the given service's tenant "
                f"{self.own_service.tenant_id!r}"
            )
        self.pinned = tenant_id is not None
        self._tenants = RunTenants(self.own_service, pinned=self.pinned)
        fields = (index or {}).get("fields") or ["$"]
        self._fields = [(f, tokenize_path(f) if f != "$" else f) for f in fields]
        self._sweeper: Any = None

    @property
    def service(self) -> MemoryService:
        """The memory service of the tenant this call serves: the run's, in a run."""
        return self._tenants.current()  # type: ignore[no-any-return]

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None,
        tenant_id: str | None = None, db_name: str = "accord",
    ) -> Iterator[AccordStore]:  # fmt: skip
        """A store on a new client for ``conn_string``, set up, closed on exit."""
        client: MongoClient[Any] = MongoClient(
            conn_string, **client_options(conn_string, {})
        )  # (a typo'd host: ACCORD_SERVER_SELECTION_TIMEOUT, not 30 s)
        try:
            store = cls(
                client,
                index=index,
                ttl=ttl,
                tenant_id=tenant_id,
                db_name=db_name,
                conn_string=conn_string,
            )
            store.setup()
            yield store
            store.stop_ttl_sweeper()
        finally:
            client.close()

    def setup(self) -> None:
        """Create collections, indexes and the vector index (idempotent)."""
        self.service.setup()

    # -- BaseStore ---------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if not _IS_SYNC and self.loop is None:
            self.loop = asyncio.get_running_loop()
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = [None] * len(ops)
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results[i] = self._get(op)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list(op)
            elif not isinstance(op, PutOp):
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        puts = [op for op in ops if isinstance(op, PutOp)]
        if puts:
            reqs = [self._request(op) for op in puts]
            # a batch of deletes only is recorded as such (a PutOp without value deletes)
            action = "store.delete" if all(op.value is None for op in puts) else "store.put"
            self.service.apply([r for r, _ in reqs], [e for _, e in reqs],
                                     operation=action)  # fmt: skip
        return results

    # -- ops ---------------------------------------------------------------------------------------

    def _refresh(self, requested: bool | None) -> bool:
        if requested is not None:
            return requested
        return bool((self.ttl_config or {}).get("refresh_on_read", True))

    def _get(self, op: GetOp) -> Item | None:
        found = self.service.get(op.namespace, op.key, refresh_ttl=self._refresh(op.refresh_ttl))
        return _item(found) if found is not None else None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        hits = self.service.search(
            op.namespace_prefix, query=op.query, filter=op.filter, limit=op.limit,
            offset=op.offset, refresh_ttl=self._refresh(op.refresh_ttl),
        )  # fmt: skip
        return [_search_item(h) for h in hits]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        # every condition must hold, as in InMemoryStore (an application's own scope and a
        # caller's condition): several prefixes (suffixes) are merged into one pattern
        paths: dict[str, list[tuple[str, ...]]] = {"prefix": [], "suffix": []}
        for cond in op.match_conditions or ():
            if cond.match_type in paths:
                path = model.check_namespace(cond.path, allow_empty=True, field=cond.match_type)
                paths[cond.match_type].append(path if cond.match_type == "prefix" else path[::-1])
        prefix = model.joint_pattern(paths["prefix"]) if paths["prefix"] else ()
        suffix = model.joint_pattern(paths["suffix"]) if paths["suffix"] else ()
        if prefix is None or suffix is None:  # two conditions no namespace meets together
            validation.check_page(op.limit, op.offset)
            if op.max_depth is not None:
                validation.check_int(op.max_depth, "max_depth", low=1)
            return []
        return self.service.list_namespaces(
            prefix=prefix or None, suffix=suffix[::-1] or None, max_depth=op.max_depth,
            limit=op.limit, offset=op.offset,
        )  # fmt: skip

    def _request(self, op: PutOp) -> tuple[PutRequest, bool]:
        ns = model.check_namespace(op.namespace)
        key = validation.check_key(op.key)
        if op.value is None:
            return PutRequest(ns, key, None), False
        # Before its texts are read: a value that is not JSON MongoDB stores exactly (a
        # datetime, a set, bytes, NaN, 2**64, 1,000 levels deep...) is an InvalidInputError
        # naming the field, never a TypeError or a RecursionError from serialising it.
        value = validation.check_value(op.value)
        ttl = op.ttl if op.ttl is not None else (self.ttl_config or {}).get("default_ttl")
        ttl_minutes = validation.check_ttl(ttl)
        embed = op.index is not False
        field_texts: list[tuple[str, str]] = []
        if embed:
            if isinstance(op.index, list):  # LangGraph's tokenizer takes strings only
                for i, p in enumerate(op.index):
                    validation.check_text(p, f"index[{i}]")
            paths = (
                self._fields
                if not isinstance(op.index, list)
                else [(p, tokenize_path(p) if p != "$" else p) for p in op.index]
            )
            for path, tokens in paths:
                texts = [validation.cut_text(t) for t in get_text_at_path(value, tokens)]
                # LangGraph's naming: one text keeps its path, several are numbered.
                if len(texts) == 1:
                    field_texts.append((path, texts[0]))
                else:
                    field_texts.extend((f"{path}.{i}", t) for i, t in enumerate(texts))
            embed = bool(field_texts)
        text = validation.cut_text("\n".join(t for _, t in field_texts)) if field_texts else None
        req = PutRequest(ns, key, dict(value), text=text,
                         provenance=model.Provenance(tenant_id=self.service.tenant_id),
                         ttl_minutes=ttl_minutes, field_texts=tuple(field_texts))  # fmt: skip
        return req, embed

    # -- TTL ---------------------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete expired items now; returns how many."""
        return self.service.sweep_expired()


def _item(m: Memory) -> Item:
    return Item(value=m.value, key=m.key, namespace=m.namespace, created_at=m.created_at,
                updated_at=m.updated_at)  # fmt: skip


def _search_item(m: Memory) -> SearchItem:
    return SearchItem(namespace=m.namespace, key=m.key, value=m.value, created_at=m.created_at,
                      updated_at=m.updated_at, score=m.score)  # fmt: skip
