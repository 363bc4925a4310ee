"""User variables: the ``let`` option of find, aggregate, update, delete and findAndModify.

mongod evaluates each ``let`` expression once, before the command runs, and makes the
results available as ``$$name`` inside aggregation expressions: ``$expr`` in a filter,
and the expressions of pipeline stages (including an update's pipeline). This module
evaluates them and binds them into the command's filter or pipeline, replacing each
``$$name`` reference with ``{$literal: value}``, so the evaluators never need to know
about variables. A ``$$name`` outside an expression (a plain string in an equality
filter) is data and stays as it is, as in mongod.
"""

from __future__ import annotations

import re
from typing import Any

from accord.platform.embedded import mongomock_bridge
from accord.platform.embedded.errors import Code, EngineError

__all__ = ["bind_expression", "bind_filter", "bind_pipeline", "evaluate_let"]

Doc = dict[str, Any]
# mongod: user variable names start with a lowercase letter or a non-ASCII character.
_NAME = re.compile(r"[a-z\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*")
# System variables a user may not redefine.
_SYSTEM = {"ROOT", "CURRENT", "REMOVE", "NOW", "CLUSTER_TIME", "DESCEND", "PRUNE", "KEEP"}


def evaluate_let(spec: Any) -> Doc:
    """The values of a command's ``let`` document (each expression evaluated once)."""
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise EngineError(
            Code.TypeMismatch,
            f"BSON field 'let' is the wrong type '{type(spec).__name__}', expected type 'object'",
        )
    values: Doc = {}
    for name, expression in spec.items():
        if name in _SYSTEM or not _NAME.fullmatch(name):
            raise EngineError(
                Code.FailedToParse,
                f"'{name}' starts with an invalid character for a user variable name",
            )
        bound = bind_expression(expression, values)  # later variables may use earlier ones
        try:
            values[name] = mongomock_bridge.evaluate_expression(bound, {})
        except KeyError:
            values[name] = None  # a missing value
        except (mongomock_bridge.OperationFailure, NotImplementedError) as exc:
            raise EngineError(
                Code.BadValue, f"cannot evaluate let variable '{name}': {exc}"
            ) from exc
    return values


def bind_expression(node: Any, variables: Doc) -> Any:
    """``node`` (an aggregation expression) with ``$$name`` references replaced by values."""
    if not variables:
        return node
    if isinstance(node, str):
        if node.startswith("$$"):
            name, _, rest = node[2:].partition(".")
            if name in variables:
                value = variables[name]
                for part in rest.split(".") if rest else []:
                    value = value.get(part) if isinstance(value, dict) else None
                return {"$literal": value}
        return node
    if isinstance(node, list):
        return [bind_expression(n, variables) for n in node]
    if isinstance(node, dict):
        if set(node) == {"$literal"}:
            return node
        return {k: bind_expression(v, variables) for k, v in node.items()}
    return node


def bind_filter(node: Any, variables: Doc) -> Any:
    """A query filter with variables bound inside its ``$expr`` clauses only."""
    if not variables:
        return node
    if isinstance(node, list):
        return [bind_filter(n, variables) for n in node]
    if isinstance(node, dict):
        return {
            k: bind_expression(v, variables) if k == "$expr" else bind_filter(v, variables)
            for k, v in node.items()
        }
    return node


def bind_pipeline(pipeline: Any, variables: Doc) -> Any:
    """An aggregation pipeline with variables bound into every stage's expressions."""
    if not variables or not isinstance(pipeline, list):
        return pipeline
    return [_bind_stage(stage, variables) for stage in pipeline]


def _bind_stage(stage: Any, variables: Doc) -> Any:
    if not isinstance(stage, dict) or len(stage) != 1:
        return stage  # the pipeline runner reports the malformed stage
    ((name, spec),) = stage.items()
    if name == "$match":
        return {name: bind_filter(spec, variables)}
    if name == "$lookup" and isinstance(spec, dict):
        out = dict(spec)
        if isinstance(spec.get("let"), dict):
            out["let"] = bind_expression(spec["let"], variables)
        if "pipeline" in spec:
            # The sub-pipeline sees the outer variables too (its own let shadows them).
            inner = {k: v for k, v in variables.items() if k not in (spec.get("let") or {})}
            out["pipeline"] = bind_pipeline(spec["pipeline"], inner)
        return {name: out}
    if name == "$facet" and isinstance(spec, dict):
        return {name: {k: bind_pipeline(p, variables) for k, p in spec.items()}}
    return {name: bind_expression(spec, variables)}
