"""Atlas search index commands and the search stages of ``aggregate``.

``createSearchIndexes``, ``updateSearchIndex``, ``dropSearchIndex`` as pymongo sends them
(``Collection.create_search_index`` and friends), ``$listSearchIndexes`` and
``$vectorSearch`` as first stages of ``aggregate``. Everything else about ``aggregate`` is the
read module's handler, which this one wraps; every pipeline is checked first
(``stage_rules``).
"""

from __future__ import annotations

from typing import Any

from accord.platform.embedded import stage_rules, vector_search
from accord.platform.embedded.aggregate import Pipeline
from accord.platform.embedded.commands import read
from accord.platform.embedded.commands.base import (
    COMMANDS,
    Context,
    Doc,
    command,
    ns_of,
    opt_doc,
    opt_int,
    opt_list,
)
from accord.platform.embedded.cursors import packed
from accord.platform.embedded.errors import Code, EngineError, type_mismatch

_plain_aggregate = COMMANDS["aggregate"]


@command("createSearchIndexes")
def cmd_create_search_indexes(ctx: Context, cmd: Doc) -> Doc:
    ns = ns_of(ctx, cmd, "createSearchIndexes")
    specs = opt_list(cmd, "indexes")
    if not specs:
        raise EngineError(
            Code.BadValue, "createSearchIndexes needs at least one index in 'indexes'"
        )
    manager = vector_search.manager(ctx.engine)
    ctx.engine.ensure_collection(ns)
    created = []
    for spec in specs:
        if not isinstance(spec, dict):
            raise type_mismatch("each search index specification must be an object")
        name = spec.get("name", "default")
        if not isinstance(name, str) or not name:
            raise EngineError(Code.BadValue, "search index 'name' must be a non-empty string")
        index_type = spec.get("type", "search")
        index = manager.create(ns, name, index_type, opt_doc(spec, "definition"))
        created.append({"id": index.id, "name": index.name})
    return {"indexesCreated": created, "ok": 1.0}


def _target(ctx: Context, cmd: Doc, verb: str) -> vector_search.SearchIndex:
    ns = ns_of(ctx, cmd, verb)
    name, id_ = cmd.get("name"), cmd.get("id")
    if (name is None) == (id_ is None):
        raise EngineError(Code.BadValue, f"{verb} needs exactly one of 'name' or 'id'")
    index = vector_search.manager(ctx.engine).find(ns, name=name, id_=id_)
    if index is None:
        raise EngineError(
            Code.IndexNotFound, f"Search index {name or id_!r} not found on collection {ns}"
        )
    return index


@command("updateSearchIndex")
def cmd_update_search_index(ctx: Context, cmd: Doc) -> Doc:
    index = _target(ctx, cmd, "updateSearchIndex")
    vector_search.manager(ctx.engine).update(index, opt_doc(cmd, "definition"))
    return {"ok": 1.0}


@command("dropSearchIndex")
def cmd_drop_search_index(ctx: Context, cmd: Doc) -> Doc:
    index = _target(ctx, cmd, "dropSearchIndex")
    vector_search.manager(ctx.engine).drop(index)
    return {"ok": 1.0}


@command("aggregate")
def cmd_aggregate(ctx: Context, cmd: Doc) -> Doc:
    pipeline = cmd.get("pipeline")
    if isinstance(pipeline, list):
        # The whole pipeline is checked before any of it runs, as mongod parses it.
        stage_rules.check(pipeline)
    first = pipeline[0] if isinstance(pipeline, list) and pipeline else None
    if not isinstance(first, dict) or len(first) != 1 or cmd.get("aggregate") == 1:
        return _plain_aggregate(ctx, cmd)
    assert isinstance(pipeline, list)
    (stage,) = first
    if stage == "$listSearchIndexes":
        return _list_search_indexes(ctx, cmd, first[stage], pipeline[1:])
    if stage == "$vectorSearch":
        return _vector_search(ctx, cmd, first[stage], pipeline[1:])
    return _plain_aggregate(ctx, cmd)


def _list_search_indexes(ctx: Context, cmd: Doc, spec: Any, rest: list[Any]) -> Doc:
    ns = ns_of(ctx, cmd, "aggregate")
    if not isinstance(spec, dict):
        raise type_mismatch("$listSearchIndexes needs an object")
    name, id_ = spec.get("name"), spec.get("id")
    indexes = vector_search.manager(ctx.engine).indexes_of(ns)
    docs = [
        i.listing()
        for i in indexes
        if (name is None or i.name == name) and (id_ is None or i.id == id_)
    ]
    return _finish(ctx, cmd, ns, docs, rest)


def _vector_search(ctx: Context, cmd: Doc, spec: Any, rest: list[Any]) -> Doc:
    ns = ns_of(ctx, cmd, "aggregate")
    q = vector_search.parse_stage(spec)
    hits = vector_search.manager(ctx.engine).search(ctx.txn, ns, q)
    # the hits are fresh documents: the later stages need not copy them first
    return _finish(ctx, cmd, ns, hits, [_with_score(stage) for stage in rest], strip=True,
                   owned=True)  # fmt: skip


def _finish(
    ctx: Context, cmd: Doc, ns: str, docs: list[Doc], rest: list[Any], strip: bool = False,
    owned: bool = False,
) -> Doc:  # fmt: skip
    name = ns.split(".", 1)[1]
    with ctx.engine.released(ctx.txn):
        result = Pipeline(read.reader(ctx), name).run(docs, rest, owned=owned) if rest else docs
        if strip:
            for doc in result:
                doc.pop(vector_search.SCORE_FIELD, None)
        reply = packed(result)
    cursor_opts = cmd.get("cursor")
    batch_size = opt_int(cursor_opts if isinstance(cursor_opts, dict) else {}, "batchSize")
    return read.reply_cursor(ctx, ns, reply, batch_size)


def _with_score(stage: Any) -> Any:
    """Rewrite ``{$meta: "vectorSearchScore"}`` to the hidden score field, and keep that field
    through inclusion projections, so later stages can still read the score."""
    if not isinstance(stage, dict) or len(stage) != 1:
        return stage
    ((name, spec),) = stage.items()
    spec = _replace_meta(spec)
    if name == "$project" and isinstance(spec, dict) and _is_inclusion(spec):
        spec = dict(spec)
        spec.setdefault(vector_search.SCORE_FIELD, 1)
    return {name: spec}


def _replace_meta(node: Any) -> Any:
    if isinstance(node, dict):
        if node == {"$meta": "vectorSearchScore"}:
            return f"${vector_search.SCORE_FIELD}"
        return {k: _replace_meta(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_meta(v) for v in node]
    return node


def _is_inclusion(spec: Doc) -> bool:
    for key, value in spec.items():
        if key == "_id":
            continue
        if value in (0, False):
            return False
    return True
