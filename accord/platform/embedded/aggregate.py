"""Aggregation pipelines over a transaction's view of the data.

Stages whose semantics mongomock gets right are delegated to its handlers; the ones it
lacks or gets wrong for the platform ($unset, $replaceWith, $lookup with a pipeline,
$facet over this runner, $match/$sort with this engine's evaluators) are done here.
``extra_stages`` lets the engine plug in stages such as ``$vectorSearch``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from accord.platform.embedded import limits, mongomock_bridge, query
from accord.platform.embedded.errors import Code, EngineError, bad_value
from accord.platform.embedded.mongomock_bridge import OperationFailure
from accord.platform.embedded.paths import MISSING
from accord.platform.embedded.values import bson_type_name
from accord.platform.embedded.variables import bind_pipeline

Doc = dict[str, Any]
# Reads the documents of another collection of the same database (for $lookup).
CollectionReader = Callable[[str], list[Doc]]
StageHandler = Callable[[list[Doc], Any, "Pipeline"], list[Doc]]

FIRST_STAGE_ONLY = {"$vectorSearch", "$search", "$documents"}


class Pipeline:
    """Runs one pipeline; ``reader`` resolves other collections of the database."""

    extra_stages: dict[str, StageHandler] = {}

    def __init__(self, reader: CollectionReader, collection: str | None) -> None:
        self.reader = reader
        self.collection = collection

    def run(self, docs: list[Doc], pipeline: list[Any], *, owned: bool = False) -> list[Doc]:
        """Run ``pipeline`` over ``docs``; ``owned``: the caller hands over fresh documents
        the stages may change in place (otherwise they are copied first)."""
        if not isinstance(pipeline, list):
            raise EngineError(Code.TypeMismatch, "'pipeline' option must be specified as an array")
        if not owned:
            docs = copy.deepcopy(docs)
        for position, stage in enumerate(pipeline):
            if not isinstance(stage, dict) or len(stage) != 1:
                raise EngineError(
                    Code.Location40323,
                    "A pipeline stage specification object must contain exactly one field.",
                )
            ((name, spec),) = stage.items()
            if name in FIRST_STAGE_ONLY and position != 0:
                raise EngineError(
                    Code.Location40602, f"{name} is only valid as the first stage in a pipeline"
                )
            limits.check()
            docs = self._stage(name, spec, docs)
        return docs

    def _stage(self, name: str, spec: Any, docs: list[Doc]) -> list[Doc]:
        if name in self.extra_stages:
            return self.extra_stages[name](docs, spec, self)
        if name == "$match":
            query.check_filter(spec)
            return [d for d in docs if query.matches(spec, d)]
        if name == "$sort":
            if not isinstance(spec, dict) or not spec:
                raise EngineError(Code.Location15976, "$sort stage must have at least one sort key")
            return query.sort_docs(docs, spec)
        if name in ("$limit", "$skip"):
            if isinstance(spec, bool) or not isinstance(spec, int | float) or spec < 0:
                raise EngineError(Code.Location15958, f"invalid argument to {name} stage: {spec!r}")
            if isinstance(spec, float) and not spec.is_integer():  # NaN, infinities, 1.5
                raise EngineError(
                    Code.Location15958,
                    f"invalid argument to {name} stage: Expected an integer: {name}: {spec!r}",
                )
            if name == "$limit" and spec == 0:
                raise EngineError(Code.Location15958, "the limit must be positive")
            return docs[: int(spec)] if name == "$limit" else docs[int(spec) :]
        if name == "$unset":
            fields = [spec] if isinstance(spec, str) else spec
            if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
                raise EngineError(
                    Code.Location31002, "$unset specification must be a string or an array"
                )
            return [query.project(d, {f: 0 for f in fields}) for d in docs]
        if name == "$replaceWith":
            return self._stage("$replaceRoot", {"newRoot": spec}, docs)
        if name == "$sortByCount":
            grouped = self._stage("$group", {"_id": spec, "count": {"$sum": 1}}, docs)
            return query.sort_docs(grouped, {"count": -1})
        if name == "$facet":
            if not isinstance(spec, dict):
                raise EngineError(
                    Code.Location15947, "a facet's fields must be specified in an object"
                )
            return [
                {k: Pipeline(self.reader, self.collection).run(docs, p) for k, p in spec.items()}
            ]
        if name == "$lookup":
            return self._lookup(spec, docs)
        if name == "$count":
            if not isinstance(spec, str) or not spec or spec.startswith("$") or "." in spec:
                raise EngineError(
                    Code.Location40156,
                    "the count field must be a non-empty string without '$' or '.'",
                )
            return [{spec: len(docs)}] if docs else []
        if name == "$unwind":
            return _unwind(spec, docs)
        if name == "$documents":
            if not isinstance(spec, list):
                raise bad_value("$documents needs an array of documents")
            for entry in spec:
                if not isinstance(entry, dict):
                    raise EngineError(
                        Code.TypeMismatch,
                        "$documents needs an array of documents, found an element of type "
                        f"{bson_type_name(entry)}",
                    )
            return copy.deepcopy(spec)
        handler = mongomock_bridge.pipeline_stage(name)
        if handler is None or name in ("$out", "$merge", "$graphLookup"):
            raise EngineError(Code.Location40324, f"Unrecognized pipeline stage name: '{name}'")
        try:
            return list(handler(docs, None, spec))
        except EngineError:
            raise
        except OperationFailure as exc:
            raise EngineError(exc.code or Code.BadValue, str(exc)) from exc
        except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise bad_value(f"{name} failed: {exc}") from exc

    def _lookup(self, spec: Any, docs: list[Doc]) -> list[Doc]:
        if not isinstance(spec, dict) or "as" not in spec or not isinstance(spec["as"], str):
            raise EngineError(Code.Location40319, "$lookup requires an 'as' field")
        for key in ("from", "localField", "foreignField"):
            if key in spec and not isinstance(spec[key], str):
                raise EngineError(
                    Code.FailedToParse,
                    f"$lookup argument '{key}' must be a string, found {spec[key]!r}: "
                    f"{bson_type_name(spec[key])}",
                )
        if "let" in spec and not isinstance(spec["let"], dict):
            raise EngineError(
                Code.FailedToParse,
                f"$lookup argument 'let' must be an object, is type {bson_type_name(spec['let'])}",
            )
        foreign = self.reader(spec["from"]) if "from" in spec else []
        local_field, foreign_field = spec.get("localField"), spec.get("foreignField")
        if (local_field is None) != (foreign_field is None):
            raise EngineError(
                Code.Location40321,
                "$lookup requires both or neither of localField and foreignField",
            )
        sub_pipeline = spec.get("pipeline")
        let = spec.get("let") or {}
        out = []
        for doc in docs:
            matched = foreign
            if local_field is not None:
                locals_ = [v for v in query.path_values(doc, local_field) if v is not MISSING]
                if not locals_:
                    locals_ = [None]
                keyed = [query.canonical(v) for v in locals_]
                matched = [
                    f for f in foreign
                    if any(query.canonical(v) in keyed for v in _values_or_null(f, str(foreign_field)))
                ]  # fmt: skip
            if sub_pipeline is not None:
                variables = {
                    name: mongomock_bridge.evaluate_expression(expr, doc)
                    for name, expr in let.items()
                }
                bound = bind_pipeline(sub_pipeline, variables)
                matched = Pipeline(self.reader, spec.get("from")).run(matched, bound)
            new = dict(doc)
            new[spec["as"]] = copy.deepcopy(matched)
            out.append(new)
        return out


def _values_or_null(doc: Doc, path: str) -> list[Any]:
    values = [v for v in query.path_values(doc, path) if v is not MISSING]
    return values or [None]


def _unwind(spec: Any, docs: list[Doc]) -> list[Doc]:
    options = {"path": spec} if isinstance(spec, str) else spec
    if not isinstance(options, dict):
        raise EngineError(
            Code.Location15981,
            "expected either a string or an object as specification for $unwind stage",
        )
    path = options.get("path")
    if not isinstance(path, str) or not path.startswith("$"):
        raise EngineError(
            Code.Location28818, "path option to $unwind stage should be prefixed with a '$'"
        )
    field_path = path[1:]
    unknown = set(options) - {"path", "includeArrayIndex", "preserveNullAndEmptyArrays"}
    if unknown:
        raise EngineError(
            Code.Location28811, f"unrecognized option to $unwind stage: {sorted(unknown)[0]}"
        )
    index_field = options.get("includeArrayIndex")
    if index_field is not None and not isinstance(index_field, str):
        raise EngineError(
            Code.Location28810,
            "expected a non-empty string for the includeArrayIndex option to $unwind stage",
        )
    if isinstance(index_field, str) and index_field.startswith("$"):
        raise EngineError(
            Code.Location28822,
            "includeArrayIndex option to $unwind stage should not be prefixed with a '$': "
            + index_field,
        )
    preserve = options.get("preserveNullAndEmptyArrays", False)
    if not isinstance(preserve, bool):
        raise EngineError(
            Code.Location28809,
            "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage",
        )
    out: list[Doc] = []
    for doc in docs:
        found, value = _get_dotted(doc, field_path)
        if isinstance(value, list) and value:
            for i, item in enumerate(value):
                new = copy.deepcopy(doc)
                _set_dotted(new, field_path, item)
                if index_field:
                    _set_dotted(new, index_field, i)
                out.append(new)
        elif isinstance(value, list) or not found or value is None:
            if preserve:
                new = copy.deepcopy(doc)
                if isinstance(value, list):
                    _unset_dotted(new, field_path)
                if index_field:
                    _set_dotted(new, index_field, None)
                out.append(new)
        else:  # a non-array value unwinds to itself
            new = copy.deepcopy(doc)
            if index_field:
                _set_dotted(new, index_field, None)
            out.append(new)
    return out


def _get_dotted(doc: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return False, None
        doc = doc[part]
    return True, doc


def _set_dotted(doc: Doc, path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        doc = doc.setdefault(part, {})
    doc[parts[-1]] = value


def _unset_dotted(doc: Doc, path: str) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        doc = doc.get(part, {})
    if isinstance(doc, dict):
        doc.pop(parts[-1], None)
