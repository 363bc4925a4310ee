"""``explain``: which plan the planner picks for a find, count, distinct, aggregate,
update, delete or findAndModify, and (verbosity ``executionStats`` and up) what running
it examined. Writes are planned but never applied."""

from __future__ import annotations

from accord.platform.embedded import planner
from accord.platform.embedded.commands.base import Context, Doc, command, ns_of, opt_doc
from accord.platform.embedded.commands.read import parse_find, pipeline_query
from accord.platform.embedded.errors import Code, EngineError, bad_value, failed_to_parse

VERBOSITIES = ("queryPlanner", "executionStats", "allPlansExecution")


@command("explain")
def cmd_explain(ctx: Context, cmd: Doc) -> Doc:
    inner = cmd.get("explain")
    if not isinstance(inner, dict) or not inner:
        raise failed_to_parse("explain needs the command to explain, as an object")
    verbosity = cmd.get("verbosity", "allPlansExecution")
    if verbosity not in VERBOSITIES:
        raise bad_value(f"verbosity must be one of {', '.join(VERBOSITIES)}, got {verbosity!r}")
    name = next(iter(inner))
    q, ns = _query_of(ctx, name, inner)
    run = ctx.engine.find(ctx.txn, ns, q)
    out = planner.explain_doc(ns, q, run, verbosity)
    out["command"] = inner
    out["serverInfo"] = {
        "host": "localhost",
        "port": 0,
        "version": "8.0.4",
        "gitVersion": "accord-embedded",
    }
    out["ok"] = 1.0
    return out


def _query_of(ctx: Context, name: str, inner: Doc) -> tuple[planner.Query, str]:
    if name == "find":
        q, _, _, _ = parse_find(inner)
        return q, ns_of(ctx, inner, "find")
    if name == "count":
        return planner.Query(opt_doc(inner, "query"), hint=inner.get("hint")), ns_of(
            ctx, inner, "count"
        )
    if name == "distinct":
        return planner.Query(opt_doc(inner, "query")), ns_of(ctx, inner, "distinct")
    if name == "aggregate":
        pipeline = inner.get("pipeline")
        if not isinstance(pipeline, list):
            raise EngineError(Code.TypeMismatch, "'pipeline' option must be specified as an array")
        q, _ = pipeline_query(pipeline)
        q.hint = inner.get("hint")
        return q, ns_of(ctx, inner, "aggregate")
    if name in ("update", "delete"):
        statements = inner.get("updates" if name == "update" else "deletes")
        if (
            not isinstance(statements, list)
            or len(statements) != 1
            or not isinstance(statements[0], dict)
        ):
            raise bad_value(f"explain of {name} needs exactly one statement")
        st = statements[0]
        multi = bool(st.get("multi")) if name == "update" else st.get("limit") == 0
        filt = st.get("q")
        if not isinstance(filt, dict):
            raise bad_value(f"explain of {name}: 'q' must be an object")
        order = opt_doc(st, "sort") or None
        return planner.Query(filt, order, 0, 0 if multi else 1, st.get("hint")), ns_of(
            ctx, inner, name
        )
    if name in ("findAndModify", "findandmodify"):
        order = opt_doc(inner, "sort") or None
        return planner.Query(opt_doc(inner, "query"), order, 0, 1, inner.get("hint")), ns_of(
            ctx, inner, name
        )
    raise EngineError(
        Code.CommandNotFound,
        f"Explain is not supported for the '{name}' command by the embedded engine",
    )
