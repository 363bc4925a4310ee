"""Input validation, done before any query is built.

Identifiers become equality predicates in MongoDB filters. A dict such as ``{"$ne": ""}`` in
place of a thread id would widen a query to every thread, so identifiers must be plain
strings; metadata filters may not carry operators either. Every refusal raises
:class:`accord.errors.InvalidInputError` and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from langchain_core.runnables import RunnableConfig

from accord.errors import InvalidInputError
from accord.platform.artifacts import CLASSES
from accord.platform.text import surrogate_at

MAX_ID_LENGTH = 1024
# longest grace `gc_artifacts` takes (no task runs a year; inf overflowed the cutoff)
MAX_ARTIFACT_GRACE = 365 * 86_400.0
_SCALARS = (str, int, float, bool, type(None))
#: Nesting of a metadata filter value, at most: what MongoDB stores (deeper never matches,
#: and would exhaust Python's stack when checked).
MAX_DEPTH = 180


def unicode_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent to MongoDB as UTF-8 (a lone surrogate such as
    ``"\\ud800"``, what a JSON ``"\\ud800"`` decodes to), or None."""
    at = surrogate_at(value)
    if at is None:
        return None
    return f"holds a lone surrogate at character {at}; strings must be valid Unicode"


def identifier(value: Any, name: str, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a usable identifier string, else raise InvalidInputError."""
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{name} must be a string, got {type(value).__name__} ({value!r:.80}); "
            f"pass the identifier as str (e.g. str(uuid4()))."
        )
    if not value and not allow_empty:
        raise InvalidInputError(f"{name} must be a non-empty string.")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"{name} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}."
        )
    if "\x00" in value:
        raise InvalidInputError(f"{name} must not contain NUL characters.")
    problem = unicode_problem(value)
    if problem:
        raise InvalidInputError(f"{name} {problem}.")
    return value


def optional_identifier(value: Any, name: str) -> str | None:
    return None if value is None else identifier(value, name)


def configurable(config: RunnableConfig | None) -> Mapping[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidInputError(f"config must be a mapping, got {type(config).__name__}.")
    conf = config.get("configurable") or {}
    if not isinstance(conf, Mapping):
        raise InvalidInputError("config['configurable'] must be a mapping.")
    return conf


def thread_ids(values: Any, name: str = "thread_ids") -> list[str]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | set | frozenset):
        raise InvalidInputError(
            f"{name} must be a sequence of strings, got {type(values).__name__}."
        )
    return [identifier(v, f"{name}[{i}]") for i, v in enumerate(values)]


def limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"limit must be a non-negative int or None, got {value!r:.80}.")
    return value


def _field_name(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"{where}: keys must be non-empty strings, got {key!r:.80}.")
    if key.startswith("$"):
        raise InvalidInputError(
            f"{where}: key {key!r:.80} looks like a query operator; metadata filters match "
            f"values exactly and accept no operators."
        )
    if "." in key or "\x00" in key:
        raise InvalidInputError(f"{where}: key {key!r:.80} must not contain '.' or NUL.")
    problem = unicode_problem(key)
    if problem:
        raise InvalidInputError(f"{where}: key {key!r:.80} {problem}.")
    return key


def _filter_value(value: Any, where: str, depth: int = 1) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise InvalidInputError(
            f"{where}: integers must fit in 64 bits (what MongoDB stores), got one of "
            f"{value.bit_length()} bits."  # not str(): it raises past 4,300 digits
        )
    if isinstance(value, str):
        problem = unicode_problem(value)
        if problem:
            raise InvalidInputError(f"{where}: the value {problem}.")
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping | list | tuple) and depth > MAX_DEPTH:
        # checked before recursing: the recursion stays MAX_DEPTH frames deep
        raise InvalidInputError(
            f"{where}: the value is nested more than {MAX_DEPTH} levels deep (MongoDB "
            f"stores no deeper metadata, so it could match nothing)."
        )
    if isinstance(value, Mapping):
        return {
            _field_name(k, where): _filter_value(v, f"{where}.{k}", depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_filter_value(v, where, depth + 1) for v in value]
    raise InvalidInputError(
        f"{where}: filter values must be JSON-like (str, int, float, bool, None, list, dict), "
        f"got {type(value).__name__}."
    )


def metadata_filter(filter: Any) -> dict[str, Any]:
    """Turn a LangGraph metadata filter into MongoDB equality predicates on ``meta``.

    Nested dicts match by containment (``{"a": {"b": 1}}`` matches metadata whose ``a``
    contains ``b == 1``), like PostgresSaver's ``@>``; lists match exactly. A value that
    is not a list never matches inside an array (``{"tags": "x"}`` does not match
    ``tags: ["x", "y"]``, as in InMemorySaver), nor does a path cross one.
    """
    if filter is None:
        return {}
    if not isinstance(filter, Mapping):
        raise InvalidInputError(f"filter must be a dict, got {type(filter).__name__}.")
    out: dict[str, Any] = {}

    not_array = {"$not": {"$type": "array"}}  # MongoDB would look into arrays

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            out[prefix] = dict(not_array)
            for k, v in value.items():
                flatten(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            out[prefix] = value  # a list equals a list, element by element
        else:
            out[prefix] = {"$eq": value, **not_array}

    for key, value in filter.items():
        _field_name(key, "filter")
        flatten(f"meta.{key}", _filter_value(value, f"filter[{key!r}]"))
    return out


def bson_safe(value: Any, depth: int = 1) -> bool:
    """Whether ``value`` can be stored as a plain, queryable BSON value in a checkpoint's
    ``meta.<key>``: valid Unicode, nested so that the document stays within
    :data:`MAX_DEPTH` levels (``meta.<key>`` is two levels down)."""
    if isinstance(value, str):
        return unicode_problem(value) is None
    if isinstance(value, bool | float | type(None)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if depth > MAX_DEPTH - 2:
        return False
    if isinstance(value, list | tuple):
        return all(bson_safe(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(
            isinstance(k, str)
            and k
            and not k.startswith("$")
            and "." not in k
            and "\x00" not in k
            and unicode_problem(k) is None
            and bson_safe(v, depth + 1)
            for k, v in value.items()
        )
    return False


#: The prefix of accord's own collection names. Some are made only when a feature is first
#: used (audit records and heads, audit cuts, hold fences...), so no catalog lists them
#: before: the prefix keeps tenant input out of them all the same.
ACCORD_PREFIX = "accord_"


def collection_name(value: Any, reserved: Set[str]) -> str:
    """Validate a business collection name."""
    name = identifier(value, "collection")
    if name.startswith(("system.", ".")) or name.endswith(".") or "$" in name or len(name) > 200:
        raise InvalidInputError(
            f"{name!r:.80} is not a valid business collection name (at most 200 characters, "
            f"no '$', not starting with 'system.', not starting or ending with '.')."
        )
    if name.startswith(ACCORD_PREFIX):
        raise InvalidInputError(
            f"{name!r} is one of accord's own collections (names starting with "
            f"{ACCORD_PREFIX!r} are accord's, made when a part or feature first needs "
            f"them); business writes must target the application's own collections."
        )
    if name in reserved:
        raise InvalidInputError(
            f"{name!r} is one of accord's own collections; business writes must target "
            f"the application's own collections."
        )
    return name


def collection_problem(value: str) -> str | None:
    """Why ``value`` is no collection name MongoDB takes, or None."""
    if not value or len(value.encode("utf-8", "surrogatepass")) > 255:
        return "must be 1 to 255 bytes long"
    if "$" in value or "\x00" in value:
        return "may not hold '$' or NUL"
    if value.startswith(("system.", ".")) or value.endswith("."):
        return "may not start with 'system.' or '.', nor end with '.'"
    if surrogate_at(value) is not None:
        return "is not valid UTF-8"
    return None


def accords_class_of(collection: str) -> str | None:
    """The class of accord's own collection named ``collection`` by default (``runs``:
    ``run``), or None."""
    for name, cls in CLASSES.items():
        if cls.default_collection == collection and not cls.tenant_writable:
            return name
    return None


def foreign_collection(value: Any, name: str) -> str:
    """A collection of another saver (MongoDBSaver's) that accord reads: a collection
    name, never one of accord's own (``accord_run_queue`` as checkpoints was read and
    recorded as a migrated MongoDBSaver collection). InvalidInputError naming ``name``."""
    value = identifier(value, name)
    problem = collection_problem(value)
    if problem:
        raise InvalidInputError(f"{name} {value!r:.80} is not a collection name: it {problem}")
    owner = accords_class_of(value)
    if owner is not None:
        raise InvalidInputError(
            f"{name} {value!r} is accord's own {owner!r} collection, not MongoDBSaver's; "
            f"nothing was read or written. Name MongoDBSaver's collection (its defaults: "
            f"'checkpoints', 'checkpoint_writes')"
        )
    return value


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value``'s documents and arrays nest more than ``limit`` levels (``value``
    itself is level 1). Iterative: no input depth can exhaust the stack here, and a cycle
    ends at the limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return False
