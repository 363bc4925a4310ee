"""One validation for every door of long-term memory: the store, the HTTP API, the MCP server.

The memory service (behind the LangGraph store), the HTTP API and the MCP server accept the
same inputs and refuse the same inputs with the same messages, because they all check them
here: the plain check functions below (``check_*``, used by the service on every write and
read, whoever calls it), and the pydantic types at the end, built from those same functions,
which the HTTP bodies and the MCP tools declare (so their schemas say what is accepted, and
no lax coercion of pydantic's applies: ``"10"``, ``true`` or ``5.5`` is not a limit, a JSON
text is not a filter).

Every refusal is an :class:`InvalidField` (an :class:`accord.errors.InvalidInputError`)
whose ``field`` names where the problem is (``value.profile.age``, ``namespace[2]``,
``ttl``) and whose message says what is allowed. Messages quote at most
:data:`PREVIEW` characters of what was sent, so an error is never larger than the input's
first few characters however large the input is.

The limits (docs/memory.md has the same table):

=========================  ===========================================================
input                      rule
=========================  ===========================================================
tenant                     1-256 characters, valid Unicode, no NUL, not starting with ``$``
namespace label            1-256 characters, valid Unicode, no ``.``, no NUL
namespace                  1-32 labels (a search prefix or a list pattern: 0-32)
key                        0-1,024 characters, valid Unicode, no NUL
kind                       a letter, then letters, digits, ``_ : -``; 1-64 characters
value                      a JSON object: str (valid Unicode), int (64-bit), float
                           (finite), bool, null, list, object (string field names without
                           NUL); nested at most 32 deep; at most 2 MiB encoded
text                       at most 100,000 characters, valid Unicode (a text derived from
                           the value is cut there)
query                      at most 10,000 characters, valid Unicode
filter                     field names not starting with ``$``, no NUL; only ``$eq $ne
                           $gt $gte $lt $lte $in``; operands JSON as in a value; nested
                           at most 32 deep
ttl (minutes)              a finite number > 0 and at most 10 years (5,256,000)
limit, offset              integers (not booleans, not strings); limit >= 0, offset >= 0;
                           the HTTP API: limit 1-100, offset at most 10,000; MCP: limit 1-50
recency_weight             a number in [0, 1]; half_life_days a finite number > 0
kinds                      at most 20 kinds
=========================  ===========================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StringConstraints
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from accord.errors import InvalidInputError

MAX_LABEL = 256
MAX_LABELS = 32
MAX_KEY = 1024
KIND_PATTERN = r"^[A-Za-z][A-Za-z0-9_:-]{0,63}$"
MAX_KINDS = 20
MAX_TEXT = 100_000
MAX_QUERY = 10_000
#: Nesting of a value or a filter (MongoDB refuses documents nested over 100 levels; a
#: memory's value sits two levels down in its document and its history).
MAX_DEPTH = 32
#: A value's size, BSON-encoded (a memory document also holds its text and vectors, and
#: MongoDB's limit is 16 MiB per document).
MAX_VALUE_BYTES = 2 * 1024 * 1024
MAX_TTL_MINUTES = 60 * 24 * 365 * 10
INT64 = (-(2**63), 2**63 - 1)
#: Page sizes of the doors that serve pages to a caller (the store's has no upper bound,
#: as LangGraph's InMemoryStore).
MAX_PAGE = 100
MAX_OFFSET = 10_000
MCP_MAX_RESULTS = 50
#: Characters of a refused input an error message quotes.
PREVIEW = 40
#: Operators a value filter may use (BaseStore's contract), and nothing else.
VALUE_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in"})

_KIND_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_KIND_REST = _KIND_FIRST | frozenset("0123456789_:-")


class InvalidField(InvalidInputError):
    """An input refused before anything was read or written; ``field`` says where
    (``value.profile.age``, ``namespace[1]``, ``limit``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def preview(value: Any) -> str:
    """``repr(value)``, cut to :data:`PREVIEW` characters (errors never echo big input)."""
    if isinstance(value, int) and value.bit_length() > 128:  # (repr refuses 4,300+ digits)
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    if isinstance(value, str | bytes) and len(value) > PREVIEW:
        return f"{value[:PREVIEW]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= PREVIEW else f"{text[:PREVIEW]}... ({type(value).__name__})"


def type_name(value: Any) -> str:
    """How a value's type is named in messages (JSON's names where there are some)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__module__}.{type(value).__qualname__}".replace("builtins.", "")


def _unicode(text: str, field: str) -> int:
    """The UTF-8 size of ``text``; refuses lone surrogates (they cannot be stored)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidField(
            field, f"holds a lone surrogate at character {exc.start}; strings must be valid Unicode"
        ) from None


# -- scalars ------------------------------------------------------------------------------------


def check_tenant(tenant_id: Any, field: str = "tenant_id") -> str:
    if not isinstance(tenant_id, str) or not tenant_id or len(tenant_id) > MAX_LABEL:
        raise InvalidField(
            field, f"must be a string of 1 to {MAX_LABEL} characters, got {preview(tenant_id)}"
        )
    if tenant_id.startswith("$") or "\x00" in tenant_id:
        raise InvalidField(field, f"{preview(tenant_id)} may not start with '$' or hold NUL")
    _unicode(tenant_id, field)
    return tenant_id


def check_label(label: Any, field: str) -> str:
    if not isinstance(label, str) or not label:
        raise InvalidField(field, f"namespace labels are non-empty strings, got {preview(label)}")
    if "." in label or "\x00" in label or len(label) > MAX_LABEL:
        raise InvalidField(
            field,
            f"namespace label {preview(label)} may not contain '.' or NUL, nor exceed "
            f"{MAX_LABEL} characters",
        )
    _unicode(label, field)
    return label


def check_namespace(
    namespace: Any, *, allow_empty: bool = False, field: str = "namespace"
) -> tuple[str, ...]:
    """A namespace as a tuple of 1 to :data:`MAX_LABELS` labels (0 with ``allow_empty``:
    a search prefix, a list pattern, where ``*`` is a label too)."""
    if not isinstance(namespace, tuple | list):
        raise InvalidField(field, f"a namespace is a list of labels, got {type_name(namespace)}")
    if not namespace and not allow_empty:
        raise InvalidField(field, "a namespace needs at least one label")
    if len(namespace) > MAX_LABELS:
        raise InvalidField(field, f"has {len(namespace)} labels; at most {MAX_LABELS}")
    for i, label in enumerate(namespace):
        check_label(label, f"{field}[{i}]")
    return tuple(namespace)


def check_key(key: Any, field: str = "key") -> str:
    if not isinstance(key, str) or "\x00" in key or len(key) > MAX_KEY:
        raise InvalidField(
            field,
            f"a memory key is a string without NUL of at most {MAX_KEY} characters, got "
            f"{preview(key) if isinstance(key, str) else type_name(key)}",
        )
    _unicode(key, field)
    return key


def check_kind(kind: Any, field: str = "kind") -> str:
    if (
        not isinstance(kind, str)
        or not 1 <= len(kind) <= 64
        or kind[0] not in _KIND_FIRST
        or any(c not in _KIND_REST for c in kind)
    ):
        raise InvalidField(
            field,
            f"a kind is a short name (a letter, then letters, digits, '_', ':' or '-'; at "
            f"most 64), such as fact or preference; got {preview(kind)}",
        )
    return kind


def check_kinds(kinds: Any, field: str = "kinds") -> tuple[str, ...] | None:
    if kinds is None:
        return None
    if not isinstance(kinds, list | tuple) or len(kinds) > MAX_KINDS:
        raise InvalidField(field, f"a list of at most {MAX_KINDS} kinds, got {preview(kinds)}")
    if not kinds:  # "only these kinds" with none would select nothing; it selected all
        raise InvalidField(field, "give at least one kind, or leave kinds out for every kind")
    return tuple(check_kind(k, f"{field}[{i}]") for i, k in enumerate(kinds))


def check_text(text: Any, field: str = "text", *, limit: int = MAX_TEXT) -> str:
    if not isinstance(text, str):
        raise InvalidField(field, f"must be a string, got {type_name(text)}")
    if len(text) > limit:
        raise InvalidField(field, f"has {len(text):,} characters; at most {limit:,}")
    _unicode(text, field)
    return text


def check_query(query: Any, field: str = "query") -> str:
    return check_text(query, field, limit=MAX_QUERY)


def cut_text(text: str) -> str:
    """A text derived from a value (its JSON, a field's text), cut to :data:`MAX_TEXT`
    characters: what is embedded and stored as the memory's ``text``."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def check_int(value: Any, field: str, *, low: int = 0, high: int | None = None) -> int:
    """An integer (JSON's: ``5`` or ``5.0``; not a boolean, not a string) in
    ``[low, high]``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidField(field, f"must be an integer, got {type_name(value)}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidField(field, f"must be {bound}, got {preview(value)}")
    return value


def check_number(
    value: Any, field: str, *, low: float, high: float, low_open: bool = False
) -> float:
    """A finite number (not a boolean, not a string) in ``[low, high]`` (``(low, high]``
    with ``low_open``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidField(field, f"must be a number, got {type_name(value)}")
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise InvalidField(field, f"must be between {low} and {high}")
    number = float(value)
    if math.isnan(number) or number > high or number < low or (low_open and number == low):
        where = f"{'>' if low_open else '>='} {low:g} and <= {high:g}"
        raise InvalidField(field, f"must be a finite number {where}, got {preview(value)}")
    return number


def check_ttl(ttl: Any, field: str = "ttl") -> float | None:
    """Minutes until a memory expires (None: never). Not zero or negative (the write
    would vanish at once), not a string or a boolean, not NaN or infinite."""
    if ttl is None:
        return None
    return check_number(ttl, field, low=0.0, high=float(MAX_TTL_MINUTES), low_open=True)


def check_page(limit: Any, offset: Any, *, max_limit: int | None = None,
               max_offset: int | None = None, low: int = 0) -> tuple[int, int]:  # fmt: skip
    """``limit`` and ``offset`` as integers (the store: any limit >= 0, as LangGraph's)."""
    return (
        check_int(limit, "limit", low=low, high=max_limit),
        check_int(offset, "offset", high=max_offset),
    )


def check_recency(weight: Any, half_life_days: Any) -> tuple[float, float]:
    return (
        check_number(weight, "recency_weight", low=0.0, high=1.0),
        check_number(half_life_days, "half_life_days", low=0.0, high=1e6, low_open=True),
    )


# -- values and filters -------------------------------------------------------------------------


def _json(node: Any, field: str, depth: int) -> int:
    """Check that ``node`` is JSON that MongoDB can store exactly (see the module's table);
    returns about its BSON size. Iterative, so no input depth can exhaust the stack."""
    size = 0
    stack: list[tuple[Any, str, int]] = [(node, field, depth)]
    while stack:
        item, where, level = stack.pop()
        if isinstance(item, str):
            size += _unicode(item, where) + 5
        elif isinstance(item, bool) or item is None:
            size += 1
        elif isinstance(item, int):
            if not INT64[0] <= item <= INT64[1]:
                raise InvalidField(
                    where,
                    "integers must fit in 64 bits (MongoDB's limit); send larger numbers as "
                    "strings",
                )
            size += 8
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidField(
                    where, f"{item} is not a number JSON can carry; numbers are finite"
                )
            size += 8
        elif isinstance(item, Mapping | list | tuple):
            if level > MAX_DEPTH:
                raise InvalidField(where, f"is nested more than {MAX_DEPTH} levels deep")
            size += 5
            if isinstance(item, Mapping):
                for k, v in item.items():
                    if not isinstance(k, str):
                        raise InvalidField(
                            where, f"field names are strings, got {type_name(k)} {preview(k)}"
                        )
                    if "\x00" in k:
                        raise InvalidField(
                            f"{where}.{preview(k)}", "field names may not contain NUL"
                        )
                    size += _unicode(k, f"{where}.{preview(k)}") + 2
                    stack.append((v, f"{where}.{k}", level + 1))
            else:
                for i, v in enumerate(item):
                    size += 2 + len(str(i))
                    stack.append((v, f"{where}[{i}]", level + 1))
        else:
            raise InvalidField(
                where,
                f"{type_name(item)} cannot be stored: memory values hold JSON (strings, "
                f"numbers, booleans, null, lists, objects) so that they read back as "
                f"written; convert it (e.g. a date to an ISO string)",
            )
        if size > MAX_VALUE_BYTES:
            raise InvalidField(field, f"is larger than {MAX_VALUE_BYTES:,} bytes encoded")
    return size


def check_value(value: Any, field: str = "value") -> dict[str, Any]:
    """A memory's value: a JSON object MongoDB stores exactly (see the module's table)."""
    if not isinstance(value, Mapping):
        raise InvalidField(field, f"a memory value is an object (a dict), got {type_name(value)}")
    _json(value, field, 1)
    return value if isinstance(value, dict) else dict(value)


def check_filter(filt: Any, field: str = "filter") -> dict[str, Any]:
    """A value filter: conditions on value fields with BaseStore's operators only.

    Field names may not start with ``$`` (no operator injection: ``{"$where": ...}`` or
    ``{"$or": ...}`` are refused) and may not hold NUL; operators are only
    ``$eq $ne $gt $gte $lt $lte $in``. The filter only ever narrows a query already scoped
    to the caller's tenant and namespace, and is applied in Python, never sent to the
    database.
    """
    if filt is None:
        return {}
    if not isinstance(filt, Mapping):
        raise InvalidField(
            field, f"a filter is an object of field -> condition, got {type_name(filt)}"
        )
    for name, cond in filt.items():
        if not isinstance(name, str) or not name or name.startswith("$") or "\x00" in name:
            raise InvalidField(
                field,
                f"filter field {preview(name)} is not allowed: fields are non-empty names "
                f"that do not start with '$'; operators go inside a field: "
                f"{{'field': {{'$gt': 1}}}}",
            )
        _condition(name, cond, field, 2)
    return dict(filt)


def _condition(name: str, cond: Any, field: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidField(field, f"is nested more than {MAX_DEPTH} levels deep")
    if isinstance(cond, Mapping):
        ops = [k for k in cond if isinstance(k, str) and k.startswith("$")]
        if ops:
            for op, operand in cond.items():
                if op not in VALUE_OPERATORS:
                    raise InvalidField(
                        field,
                        f"filter operator {preview(op)} on {preview(name)} is not supported; "
                        f"use one of {', '.join(sorted(VALUE_OPERATORS))}",
                    )
                if op == "$in" and not isinstance(operand, list | tuple):
                    raise InvalidField(field, f"$in on {preview(name)} needs a list of values")
                _json(operand, f"{field}.{name}.{op}", depth + 1)
            return
        for k, v in cond.items():
            if not isinstance(k, str) or not k or "\x00" in k:
                raise InvalidField(
                    field, f"filter key {preview(k)} inside {preview(name)} is not allowed"
                )
            _condition(f"{name}.{k}", v, field, depth + 1)
        return
    _json(cond, f"{field}.{name}", depth)


# -- the same rules as pydantic types (HTTP bodies, MCP tool arguments) -------------------------


def _pydantic(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check`` for a pydantic validator: its message without the field name (pydantic
    adds the location)."""

    def validate(value: Any) -> Any:
        try:
            return check(value)
        except InvalidField as exc:
            message = exc.reason if exc.field in _TOP_FIELDS else str(exc)
            raise PydanticCustomError("invalid", "{reason}", {"reason": message}) from None

    return validate


_TOP_FIELDS = frozenset(
    {"namespace", "namespace_prefix", "prefix", "key", "kind", "kinds", "text", "query",
     "value", "filter", "limit", "offset", "ttl", "ttl_minutes", "recency_weight"}
)  # fmt: skip

#: What the schemas say (JSON Schema has no words for "valid Unicode", "64-bit integers"
#: or "encoded size"; those are checked all the same).
LabelSchema = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_LABEL, pattern=r"^[^.\x00]+$")
]
KeySchema = Annotated[str, StringConstraints(max_length=MAX_KEY, pattern=r"^[^\x00]*$")]
KindSchema = Annotated[str, StringConstraints(pattern=KIND_PATTERN)]
ValueKeySchema = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
JsonSchemaValue = TypeAliasType(  # type: ignore[misc]
    "JsonValue",
    "str | int | float | bool | None | list[JsonSchemaValue] | dict[ValueKeySchema, JsonSchemaValue]",
)
FieldNameSchema = Annotated[
    str, StringConstraints(pattern=r"^[^$\x00][^\x00]*$", max_length=MAX_LABEL)
]
Scalar = str | int | float | bool | None
#: An operator's operand in the schema: JSON a document can hold (no NUL in field names),
#: what check_filter takes (a recursive alias mypy cannot read: Any to it).
if TYPE_CHECKING:
    Operand = Any
else:
    Operand = JsonSchemaValue


class Operators(BaseModel):
    """Comparison operators on one field (BaseStore's set; nothing else is accepted); the
    schema of a filter's operators (the filter itself is checked by :func:`check_filter`)."""

    model_config = ConfigDict(extra="forbid")

    eq: Operand = Field(default=None, alias="$eq")
    ne: Operand = Field(default=None, alias="$ne")
    gt: Operand = Field(default=None, alias="$gt")
    gte: Operand = Field(default=None, alias="$gte")
    lt: Operand = Field(default=None, alias="$lt")
    lte: Operand = Field(default=None, alias="$lte")
    in_: list[Operand] = Field(default=None, alias="$in")  # type: ignore[arg-type]


#: What a filter compares a field with: a value, a list, operators, or (for a field that
#: holds an object) conditions on its fields.
ConditionSchema = TypeAliasType(  # type: ignore[misc]
    "Condition",
    "Scalar | list[JsonSchemaValue] | Operators | dict[FieldNameSchema, ConditionSchema]",
)


def _namespace_of(value: Any) -> tuple[str, ...]:
    return check_namespace(value)


def _prefix_of(value: Any) -> list[str]:
    return list(check_namespace(value, allow_empty=True))


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _int_between(low: int, high: int, field: str) -> Callable[[Any], int]:
    return lambda value: check_int(value, field, low=low, high=high)


Namespace = Annotated[
    list[str],
    PlainValidator(_pydantic(lambda v: list(_namespace_of(v))),
                   json_schema_input_type=Annotated[list[LabelSchema],
                                                    Field(min_length=1, max_length=MAX_LABELS)]),
]  # fmt: skip
NamespacePrefix = Annotated[
    list[str],
    PlainValidator(_pydantic(_prefix_of),
                   json_schema_input_type=Annotated[list[LabelSchema],
                                                    Field(max_length=MAX_LABELS)]),
]  # fmt: skip
Key = Annotated[str, PlainValidator(_pydantic(check_key), json_schema_input_type=KeySchema)]
KeyOrNone = Annotated[
    str | None,
    PlainValidator(_pydantic(_optional(check_key)), json_schema_input_type=KeySchema | None),
]
#: :data:`KeyOrNone` declared as ``str``: the MCP SDK parses a string argument declared as
#: anything else as JSON (a key ``"null"`` became None, ``"[1]"`` a list).
KeyOrNoneAsText = Annotated[
    str,
    PlainValidator(_pydantic(_optional(check_key)), json_schema_input_type=KeySchema | None),
]
NamespaceOrNone = Annotated[
    list[str] | None,
    PlainValidator(_pydantic(_optional(lambda v: list(_namespace_of(v)))),
                   json_schema_input_type=Annotated[list[LabelSchema],
                                                    Field(min_length=1, max_length=MAX_LABELS)]
                   | None),
]  # fmt: skip
NamespacePrefixOrNone = Annotated[
    list[str] | None,
    PlainValidator(_pydantic(_optional(_prefix_of)),
                   json_schema_input_type=Annotated[list[LabelSchema],
                                                    Field(max_length=MAX_LABELS)] | None),
]  # fmt: skip
Kind = Annotated[str, PlainValidator(_pydantic(check_kind), json_schema_input_type=KindSchema)]
Kinds = Annotated[
    list[str] | None,
    PlainValidator(_pydantic(lambda v: None if v is None else list(check_kinds(v) or ())),
                   json_schema_input_type=Annotated[list[KindSchema] | None,
                                                    Field(min_length=1,
                                                          max_length=MAX_KINDS)]),
]  # fmt: skip
Text = Annotated[
    str,
    PlainValidator(_pydantic(check_text),
                   json_schema_input_type=Annotated[str, Field(max_length=MAX_TEXT)]),
]  # fmt: skip
TextOrNone = Annotated[
    str | None,
    PlainValidator(_pydantic(_optional(check_text)),
                   json_schema_input_type=Annotated[str, Field(max_length=MAX_TEXT)] | None),
]  # fmt: skip
QueryOrNone = Annotated[
    str | None,
    PlainValidator(_pydantic(_optional(check_query)),
                   json_schema_input_type=Annotated[str, Field(max_length=MAX_QUERY)] | None),
]  # fmt: skip
Query = Annotated[
    str,
    PlainValidator(_pydantic(check_query),
                   json_schema_input_type=Annotated[str, Field(max_length=MAX_QUERY)]),
]  # fmt: skip
Value = Annotated[
    dict[str, Any],
    PlainValidator(_pydantic(check_value),
                   json_schema_input_type=dict[ValueKeySchema, JsonSchemaValue]),  # type: ignore[valid-type]
]  # fmt: skip
Filter = Annotated[
    dict[str, Any] | None,
    PlainValidator(_pydantic(lambda v: None if v is None else check_filter(v)),
                   json_schema_input_type=dict[FieldNameSchema, ConditionSchema] | None),  # type: ignore[valid-type]
]  # fmt: skip
TtlMinutes = Annotated[
    float | None,
    PlainValidator(_pydantic(check_ttl),
                   json_schema_input_type=Annotated[float | None,
                                                    Field(gt=0, le=MAX_TTL_MINUTES)]),
]  # fmt: skip
RecencyWeight = Annotated[
    float,
    PlainValidator(_pydantic(lambda v: check_number(v, "recency_weight", low=0.0, high=1.0)),
                   json_schema_input_type=Annotated[float, Field(ge=0.0, le=1.0)]),
]  # fmt: skip


#: A page size (JSON's integers: 5 or 5.0, never true or "5"): the HTTP API's, and the
#: MCP tools' (results go into a model's context).
PageLimit = Annotated[
    int,
    PlainValidator(_pydantic(_int_between(1, MAX_PAGE, "limit")),
                   json_schema_input_type=Annotated[int, Field(ge=1, le=MAX_PAGE)]),
]  # fmt: skip
McpLimit = Annotated[
    int,
    PlainValidator(_pydantic(_int_between(1, MCP_MAX_RESULTS, "limit")),
                   json_schema_input_type=Annotated[int, Field(ge=1, le=MCP_MAX_RESULTS)]),
]  # fmt: skip
Offset = Annotated[
    int,
    PlainValidator(_pydantic(_int_between(0, MAX_OFFSET, "offset")),
                   json_schema_input_type=Annotated[int, Field(ge=0, le=MAX_OFFSET)]),
]  # fmt: skip
Flag = Annotated[bool, PlainValidator(_pydantic(lambda v: _flag(v)), json_schema_input_type=bool)]


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidField("index", f"must be a boolean, got {type_name(value)}")
    return value
