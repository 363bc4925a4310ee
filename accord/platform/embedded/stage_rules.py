"""What mongod checks when it parses an aggregation pipeline, before it runs any of it.

mongod parses the whole pipeline, sub-pipelines included, before it reads a document:
an unknown stage anywhere, a stage where it may not stand (``$vectorSearch`` inside
``$facet`` or ``$lookup``, ``$out`` not last ...) is refused at once. The engine used to
find out only when a stage's turn came, after reading (and sorting, grouping ...) the
collection: ``$vectorSearch`` inside ``$facet`` was refused after 4.5 s of work on a
100,000-document collection. ``check`` does mongod's parse-time checks in mongod's order:

1. every stage is an object with one field naming a stage the engine knows, depth first
   through ``$facet`` and ``$lookup`` sub-pipelines (mongod's "lite parse": 40323, 40324);
2. stage by stage, each sub-pipeline's own checks (a stage ``$facet`` does not allow:
   40600; one ``$lookup`` does not allow: 51047; then its stages' positions), then the
   positions of the pipeline's stages: first only (40602), last only (40601).

Each stage's rule is mongod 8.0's ``StageConstraints`` for it. What a stage's own arguments
must be is checked when the stage runs. ``$unionWith`` (where mongod 8.0 allows
``$vectorSearch`` as the first stage of its sub-pipeline), ``$graphLookup`` and Atlas
Search's ``$search`` are not implemented: they are refused as unrecognized, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accord.platform.embedded.errors import Code, EngineError

__all__ = ["check"]


@dataclass(frozen=True)
class Rule:
    """Where a stage may stand (mongod's position, facet and lookup requirements)."""

    position: str = ""  # "first", "last", or "" (anywhere)
    in_facet: bool = True
    in_lookup: bool = True


_ANYWHERE = Rule()
RULES: dict[str, Rule] = {
    **dict.fromkeys(
        (
            "$match", "$sort", "$limit", "$skip", "$project", "$addFields", "$set", "$unset",
            "$group", "$count", "$unwind", "$replaceRoot", "$replaceWith", "$sortByCount",
            "$bucket", "$sample", "$lookup",
        ),
        _ANYWHERE,
    ),
    "$facet": Rule(in_facet=False),
    "$documents": Rule("first", in_facet=False),
    "$vectorSearch": Rule("first", in_facet=False, in_lookup=False),
    "$listSearchIndexes": Rule("first", in_facet=False),
    "$listLocalSessions": Rule("first", in_facet=False),
    "$changeStream": Rule("first", in_facet=False, in_lookup=False),
    "$out": Rule("last", in_facet=False, in_lookup=False),
    "$merge": Rule("last", in_facet=False, in_lookup=False),
}  # fmt: skip


def check(pipeline: list[Any]) -> None:
    """Refuse ``pipeline`` (a top-level aggregate's) as mongod does when it parses it."""
    _names(pipeline)
    _placement(pipeline, "top")


def _stage(stage: Any) -> tuple[str, Any]:
    if not isinstance(stage, dict) or len(stage) != 1:
        raise EngineError(
            Code.Location40323,
            "A pipeline stage specification object must contain exactly one field.",
        )
    ((name, spec),) = stage.items()
    return name, spec


def _subpipelines(name: str, spec: Any) -> list[tuple[str, list[Any]]]:
    """The sub-pipelines of one stage, with the context they run in."""
    if name == "$facet" and isinstance(spec, dict):
        return [("facet", p) for p in spec.values() if isinstance(p, list)]
    if name == "$lookup" and isinstance(spec, dict) and isinstance(spec.get("pipeline"), list):
        return [("lookup", spec["pipeline"])]
    return []


def _names(pipeline: list[Any]) -> None:
    for stage in pipeline:
        name, spec = _stage(stage)
        if name not in RULES:
            raise EngineError(Code.Location40324, f"Unrecognized pipeline stage name: '{name}'")
        for _, sub in _subpipelines(name, spec):
            _names(sub)


def _placement(pipeline: list[Any], where: str) -> None:
    stages = [_stage(s) for s in pipeline]
    for name, spec in stages:
        for context, sub in _subpipelines(name, spec):
            _placement(sub, context)
    for name, _ in stages:
        rule = RULES[name]
        if where == "facet" and not rule.in_facet:
            raise EngineError(
                Code.Location40600, f"{name} is not allowed to be used within a $facet stage"
            )
        if where == "lookup" and not rule.in_lookup:
            raise EngineError(
                Code.Location51047, f"{name} is not allowed within a $lookup's sub-pipeline"
            )
    last = len(stages) - 1
    for i, (name, _) in enumerate(stages):
        rule = RULES[name]
        if rule.position == "first" and i != 0:
            raise EngineError(
                Code.Location40602, f"{name} is only valid as the first stage in a pipeline"
            )
        if rule.position == "last" and i != last:
            raise EngineError(
                Code.Location40601, f"{name} can only be the final stage in the pipeline"
            )
