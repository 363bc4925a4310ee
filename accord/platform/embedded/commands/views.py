"""Read-only views: ``create`` with ``viewOn`` and ``pipeline``.

A view is a catalog entry (its options hold ``viewOn`` and ``pipeline``) with no documents
of its own: reading it runs its pipeline over its source (a collection or another view)
in the reader's transaction, so it always shows the current data. find, count, distinct
and aggregate (including ``$lookup`` from a view) read through views; every write, and
index commands, answer CommandNotSupportedOnView as in MongoDB.
"""

from __future__ import annotations

from typing import Any

from accord.platform.embedded.commands.base import PIPELINE_OUTPUTS, Context, Doc
from accord.platform.embedded.engine import Collection
from accord.platform.embedded.errors import Code, EngineError

# mongod: a view may be defined on a view, up to this depth.
MAX_VIEW_DEPTH = 20


def is_view(coll: Collection | None) -> bool:
    return coll is not None and coll.options.get("viewOn") is not None


def refuse_write(coll: Collection | None, what: str = "write") -> None:
    """CommandNotSupportedOnView if ``coll`` is a view."""
    if is_view(coll):
        assert coll is not None
        raise EngineError(
            Code.CommandNotSupportedOnView,
            f"Namespace {coll.ns} is a view, not a collection: a view is read-only ({what})",
        )


def check_definition(ctx: Context, name: str, view_on: Any, pipeline: Any) -> Doc:
    """The options of a new view, checked (source name, pipeline shape, no cycle)."""
    if not isinstance(view_on, str) or not view_on:
        raise EngineError(Code.TypeMismatch, "'viewOn' must be the name of a collection or view")
    if pipeline is None:
        pipeline = []
    if not isinstance(pipeline, list) or not all(
        isinstance(s, dict) and len(s) == 1 for s in pipeline
    ):
        raise EngineError(
            Code.InvalidViewDefinition,
            "a view's 'pipeline' must be an array of stages with one field each",
        )
    for stage in pipeline:
        if next(iter(stage)) in PIPELINE_OUTPUTS:
            raise EngineError(
                Code.OptionNotSupportedOnView,
                f"{next(iter(stage))} cannot be used in a view definition",
            )
    # Walk the sources: a cycle or a chain deeper than mongod allows is refused.
    seen = {name}
    source = view_on
    for _ in range(MAX_VIEW_DEPTH):
        if source in seen:
            raise EngineError(
                Code.GraphContainsCycle, f"View cycle detected: {' -> '.join([*seen, source])}"
            )
        seen.add(source)
        coll = ctx.engine.get_collection(f"{ctx.db}.{source}")
        if not is_view(coll):
            return {"viewOn": view_on, "pipeline": pipeline}
        assert coll is not None
        source = coll.options["viewOn"]
    raise EngineError(
        Code.ViewDepthLimitExceeded,
        f"View depth too deep or view cycle detected: maximum {MAX_VIEW_DEPTH}",
    )


def resolve(ctx: Context, coll: Collection) -> tuple[str, list[Any]]:
    """The collection a view reads from and the whole pipeline it applies (innermost first)."""
    pipelines: list[list[Any]] = []
    current = coll
    for _ in range(MAX_VIEW_DEPTH + 1):
        pipelines.append(list(current.options.get("pipeline") or []))
        source_ns = f"{ctx.db}.{current.options['viewOn']}"
        source = ctx.engine.get_collection(source_ns)
        if not is_view(source):
            return source_ns, [stage for p in reversed(pipelines) for stage in p]
        assert source is not None
        current = source
    raise EngineError(Code.ViewDepthLimitExceeded, f"View depth too deep reading {coll.ns}")
