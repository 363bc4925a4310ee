"""Arithmetic expression operators as mongod evaluates them.

mongomock's arithmetic asserts on operand types (an ``AssertionError`` the client saw as
an internal error), treats booleans as numbers, takes ``[x]`` for a unary operator as
the array itself, returns ints from ``$ceil`` of a double and raises where mongod gives
an infinity (``$exp`` of 1000). These functions take parsed operands (None: null or
missing) and return mongod's result or raise its error: the type checks with mongod's
codes as read in its source (docs/engine.md says which were not checked against a running
server), the result types (a double in gives a double out, a long that overflows becomes a
double, a decimal operand makes the result decimal).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from mongomock import OperationFailure

from accord.platform.embedded.values import bson_type_name

UNARY = frozenset({"$abs", "$ceil", "$exp", "$floor", "$ln", "$log10", "$sqrt", "$trunc"})
BINARY = frozenset({"$divide", "$log", "$mod", "$pow", "$subtract"})
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL = create_decimal128_context()
_TYPE_MISMATCH = 14


def is_number(value: Any) -> bool:
    """int, long, double or decimal (a bool is not a number to mongod)."""
    return (isinstance(value, int | float | Decimal128)) and not isinstance(value, bool)


def arguments(operator: str, values: Any, count: int) -> list[Any]:
    """The operand expressions: ``[a, b]``, or for one operand ``x`` or ``[x]``."""
    if count == 1 and not isinstance(values, list):
        return [values]
    n = len(values) if isinstance(values, list) else 1
    if n != count:
        raise OperationFailure(
            f"Expression {operator} takes exactly {count} arguments. {n} were passed in.",
            code=16020,
        )
    return list(values)


def _long(value: int) -> Any:
    """An integer result: a double past 64 bits, as mongod's long arithmetic overflows."""
    return value if _INT64_MIN <= value <= _INT64_MAX else float(value)


def _integral(value: Any) -> bool:
    return isinstance(value, int | Int64) and not isinstance(value, bool)


def _as_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    return decimal.Decimal(repr(value)) if isinstance(value, float) else decimal.Decimal(value)


def _decimal(compute: Callable[..., decimal.Decimal], *values: Any) -> Decimal128:
    with decimal.localcontext(_DECIMAL) as ctx:
        ctx.traps[decimal.InvalidOperation] = False
        ctx.traps[decimal.DivisionByZero] = False
        return Decimal128(compute(*(_as_decimal(v) for v in values)))


def _float(compute: Callable[[float], float], value: float) -> float:
    try:
        return compute(value)
    except OverflowError:
        return math.inf


def unary(operator: str, value: Any) -> Any:
    """``$abs`` ... ``$trunc`` of one parsed operand."""
    if value is None:
        return None
    if not is_number(value):
        raise OperationFailure(
            f"{operator} only supports numeric types, not {bson_type_name(value)}", code=28765
        )
    if operator in ("$ln", "$log10") and not _positive(value):
        code = 28766 if operator == "$ln" else 28761
        raise OperationFailure(
            f"{operator}'s argument must be a positive number, but is {value}", code=code
        )
    if operator == "$sqrt" and _negative(value):
        raise OperationFailure("$sqrt's argument must be greater than or equal to 0", code=28714)
    if isinstance(value, Decimal128):
        return _decimal(_DECIMAL_UNARY[operator], value)
    if operator == "$abs":
        if _integral(value) and value == _INT64_MIN:
            raise OperationFailure("can't take $abs of long long min", code=28680)
        return abs(value)
    if operator in ("$ceil", "$floor", "$trunc"):
        if _integral(value) or not math.isfinite(value):
            return value
        return float(_ROUNDING[operator](value))
    return _float(_FLOAT_UNARY[operator], float(value))


def _positive(value: Any) -> bool:
    """Greater than zero, or NaN (which mongod's log operators pass through)."""
    number = value.to_decimal() if isinstance(value, Decimal128) else value
    return bool(number != number or number > 0)


def _negative(value: Any) -> bool:
    return bool((value.to_decimal() if isinstance(value, Decimal128) else value) < 0)


_ROUNDING: dict[str, Callable[[float], int]] = {
    "$ceil": math.ceil, "$floor": math.floor, "$trunc": math.trunc,
}  # fmt: skip
_FLOAT_UNARY: dict[str, Callable[[float], float]] = {
    "$exp": math.exp, "$ln": math.log, "$log10": math.log10, "$sqrt": math.sqrt,
}  # fmt: skip
_DECIMAL_UNARY: dict[str, Callable[[decimal.Decimal], decimal.Decimal]] = {
    "$abs": abs,
    "$ceil": lambda d: d.to_integral_value(decimal.ROUND_CEILING),
    "$floor": lambda d: d.to_integral_value(decimal.ROUND_FLOOR),
    "$trunc": lambda d: d.to_integral_value(decimal.ROUND_DOWN),
    "$exp": lambda d: d.exp(),
    "$ln": lambda d: d.ln(),
    "$log10": lambda d: d.log10(),
    "$sqrt": lambda d: d.sqrt(),
}


def add(values: list[Any]) -> Any:
    """``$add`` of parsed operands: numbers, and at most one date (plus milliseconds)."""
    for v in values:
        if v is not None and not is_number(v) and not isinstance(v, dt.datetime):
            raise OperationFailure(
                f"$add only supports numeric or date types, not {bson_type_name(v)}",
                code=_TYPE_MISMATCH,
            )
    dates = [v for v in values if isinstance(v, dt.datetime)]
    if len(dates) > 1:
        raise OperationFailure("only one date allowed in an $add expression", code=16612)
    if any(v is None for v in values):
        return None
    terms = [v for v in values if not isinstance(v, dt.datetime)]
    if any(isinstance(v, Decimal128) for v in terms):
        total: Any = _decimal(lambda *ds: sum(ds, start=decimal.Decimal(0)), *terms)
        if not dates:
            return total
        total = float(total.to_decimal())
    else:
        total = sum(terms)
    if dates:
        if not math.isfinite(total):
            raise OperationFailure("can't add a non-finite number to a date", code=2)
        return dates[0] + dt.timedelta(milliseconds=round(total))
    return _long(total) if _integral(total) else float(total)


def multiply(values: list[Any]) -> Any:
    """``$multiply`` of parsed operands."""
    if any(v is None for v in values):
        return None
    for v in values:
        if not is_number(v):
            raise OperationFailure(
                f"$multiply only supports numeric types, not {bson_type_name(v)}",
                code=_TYPE_MISMATCH,
            )
    if any(isinstance(v, Decimal128) for v in values):
        return _decimal(lambda *ds: math.prod(ds, start=decimal.Decimal(1)), *values)
    product: Any = 1
    for v in values:
        product = product * v
        if _integral(product) and not _INT64_MIN <= product <= _INT64_MAX:
            # a double from here on, as in mongod (a product of 100,000 longs as one
            # integer of 6 million bits took 70 s of the engine's CPU)
            product = float(product)
    return product if _integral(product) else float(product)


def binary(operator: str, a: Any, b: Any) -> Any:
    """``$divide``, ``$log``, ``$mod``, ``$pow`` and ``$subtract`` of parsed operands."""
    if operator == "$subtract":
        return _subtract(a, b)
    if a is None or b is None:
        return None
    _check_binary_types(operator, a, b)
    if operator == "$divide" and _is_zero(b):
        raise OperationFailure("can't $divide by zero", code=2)
    if operator == "$mod" and _is_zero(b):
        raise OperationFailure("can't $mod by zero", code=16610)
    if operator == "$log":
        if not _positive(a):
            raise OperationFailure(
                f"$log's argument must be a positive number, but is {a}", code=28758
            )
        if not _positive(b) or _is_one(b):
            raise OperationFailure(
                f"$log's base must be a positive number not equal to 1, but is {b}", code=28759
            )
    if operator == "$pow" and _is_zero(a) and _negative(b):
        raise OperationFailure("$pow cannot take a base of 0 and a negative exponent", code=28764)
    if isinstance(a, Decimal128) or isinstance(b, Decimal128):
        return _decimal(_DECIMAL_BINARY[operator], a, b)
    if operator == "$divide":
        return float(a) / float(b)
    if operator == "$log":
        return math.log(float(a)) / math.log(float(b))
    if operator == "$mod":
        if _integral(a) and _integral(b):
            remainder = abs(int(a)) % abs(int(b))  # the sign of the dividend, as C's %
            return remainder if a >= 0 else -remainder
        return math.fmod(float(a), float(b)) if math.isfinite(a) else math.nan
    if _integral(a) and _integral(b) and b >= 0 and (abs(a) <= 1 or b < 64):
        return _long(int(a) ** int(b))  # exact; an exponent of 64 or more overflows 2**64
    try:
        return math.pow(float(a), float(b))
    except OverflowError:
        return math.inf if a > 0 or float(b) % 2 == 0 else -math.inf
    except ValueError:  # a negative base to a fractional power
        return math.nan


_DECIMAL_BINARY: dict[str, Callable[[decimal.Decimal, decimal.Decimal], decimal.Decimal]] = {
    "$divide": lambda x, y: x / y,
    "$log": lambda x, y: x.ln() / y.ln(),
    "$mod": lambda x, y: x % y,  # the sign of the dividend
    "$pow": lambda x, y: x**y,
}


def _is_one(value: Any) -> bool:
    return bool((value.to_decimal() if isinstance(value, Decimal128) else value) == 1)


def _is_zero(value: Any) -> bool:
    return bool((value.to_decimal() if isinstance(value, Decimal128) else value) == 0)


def _check_binary_types(operator: str, a: Any, b: Any) -> None:
    if is_number(a) and is_number(b):
        return
    names = f"{bson_type_name(a)} and {bson_type_name(b)}"
    if operator == "$divide":
        raise OperationFailure(
            f"$divide only supports numeric types, not {names}", code=_TYPE_MISMATCH
        )
    if operator == "$mod":
        raise OperationFailure(f"$mod only supports numeric types, not {names}", code=16611)
    if operator == "$pow":
        which, code = ("base", 28762) if not is_number(a) else ("exponent", 28763)
        wrong = a if which == "base" else b
        raise OperationFailure(
            f"$pow's {which} must be numeric, not {bson_type_name(wrong)}", code=code
        )
    which, code = ("argument", 28756) if not is_number(a) else ("base", 28757)
    wrong = a if which == "argument" else b
    raise OperationFailure(
        f"$log's {which} must be numeric, not {bson_type_name(wrong)}", code=code
    )


def _subtract(a: Any, b: Any) -> Any:
    """Numbers, a date minus a date (milliseconds, a long) or minus a number (a date)."""
    if a is None or b is None:
        return None
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return Int64(round((a - b).total_seconds() * 1000))
    if isinstance(a, dt.datetime) and is_number(b):
        millis = float(b.to_decimal()) if isinstance(b, Decimal128) else float(b)
        if not math.isfinite(millis):
            raise OperationFailure("can't $subtract a non-finite number from a date", code=2)
        return a - dt.timedelta(milliseconds=round(millis))
    if is_number(a) and is_number(b):
        if isinstance(a, Decimal128) or isinstance(b, Decimal128):
            return _decimal(lambda x, y: x - y, a, b)
        difference = a - b
        return _long(difference) if _integral(difference) else float(difference)
    raise OperationFailure(
        f"cant $subtract a {bson_type_name(b)} from a {bson_type_name(a)}", code=_TYPE_MISMATCH
    )
