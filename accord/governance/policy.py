"""The governance policy: per artifact class, who may do what, how long it is kept, how it
is audited, and which fields identify a data subject.

A policy names every artifact class of :mod:`accord.platform.artifacts` (plus one class per
business collection the application names, ``business:NAME``). Per class:

``collection``
    the collection that holds it (business classes: the application's collection).
``roles`` / ``principals``
    which service roles (``runtime``, ``aggregator``, ``memory-api``, ``auditor``,
    ``admin``, or a role declared in ``custom_roles``) and which named principals
    (``key:ops-reader``, ``user:alice``) may ``find``, ``insert``, ``update`` and
    ``remove`` its documents. A principal gets the union of its role's and its name's grants.
``retention``
    ``expire_after`` (a duration) after an event (``created``, ``updated``,
    ``last_activity`` or ``thread_end`` of the thread, ``done`` for outbox events and
    ended queued runs), and/or
    ``keep_latest`` N checkpoints per thread; nothing means kept until erased. Dependent
    classes (a checkpoint's blobs, writes and head; a memory's vectors) go with what they
    belong to and may not expire on their own.
``audit``
    ``off``, ``metadata`` (who did what to which document) or ``full`` (with the images).
``subject_fields``
    the fields (dotted paths) that identify a data subject, for export and erasure.
``encryption``
    ``off``, ``tenant`` (payloads encrypted under a data key per tenant) or ``subject``
    (per data subject: a thread's classes per thread, others per subject-field value);
    :mod:`accord.governance.encryption`.

This module holds the models of the *effective* policy (complete, validated, with the
rules an enforcement hook needs precomputed) and of a policy *file* (every field optional:
what the file does not say comes from the default). Loading and error reporting with file
and line live in :mod:`accord.governance.loading`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from accord.platform.artifacts import CLASSES
from accord.platform.context import SERVICE_ROLES

__all__ = [
    "ACTIONS", "AUDIT_MODES", "CLASS_NAMES", "DEPENDENT", "EVENTS", "Action", "AuditMode",
    "ClassPolicy", "ClassPolicyFile", "Policy", "PolicyFile", "Retention", "RetentionFile",
    "business_class", "class_of", "parse_duration", "to_toml",
]  # fmt: skip

Action = Literal["find", "insert", "update", "remove"]
ACTIONS: tuple[Action, ...] = ("find", "insert", "update", "remove")
AuditMode = Literal["off", "metadata", "full"]
#: How a class's payloads are encrypted (accord.governance.encryption).
EncryptionScope = Literal["off", "tenant", "subject"]
AUDIT_MODES: tuple[AuditMode, ...] = ("off", "metadata", "full")
Event = Literal["created", "updated", "last_activity", "thread_end", "done"]
EVENTS: tuple[Event, ...] = ("created", "updated", "last_activity", "thread_end", "done")

#: Every class a policy names (the platform's registry); ``business:NAME`` adds one per
#: business collection.
CLASS_NAMES: tuple[str, ...] = tuple(CLASSES)
BUSINESS = "business"
#: Classes whose documents belong to documents of another class: they are kept exactly as
#: long as those (retention never removes part of what a kept checkpoint or memory needs).
DEPENDENT: Mapping[str, str] = {
    "checkpoint_blob": "checkpoint",
    "checkpoint_write": "checkpoint",
    "checkpoint_head": "checkpoint",
    "memory_vector": "long_term_memory",
}
#: Classes whose documents carry no ``tenant_id`` (accord's own bookkeeping).
UNTENANTED = frozenset({"catalog", "migration", "policy", "hold"})

#: The longest retention period (100 years).
MAX_PERIOD_S = 100 * 365 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"^\s*(-?)\s*(\d+(?:\.\d+)?)\s*([smhdwy])\s*$")


def parse_duration(value: Any) -> Any:
    """A duration: seconds as an integer, or ``"<number><unit>"`` with unit ``s``, ``m``,
    ``h``, ``d``, ``w`` or ``y`` (365 days): ``"30d"``, ``"12h"``, ``"1.5h"``. Zero or
    negative durations are refused (they would expire documents as they are written), and
    so are durations past 100 years (dates past year 9999 overflowed when stamped)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"a duration is a number of seconds or a string like '30d', not {value}")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(
                f"{value!r} is not a duration: write seconds (an integer) or a number with "
                f"a unit, s m h d w y (e.g. '30d', '12h')"
            )
        sign, number, unit = match.groups()
        seconds = float(number) * _UNITS[unit] * (-1 if sign else 1)
    else:
        raise ValueError(f"a duration is a number of seconds or a string like '30d', not {value!r}")
    if not math.isfinite(seconds) or seconds > MAX_PERIOD_S:
        raise ValueError(
            f"duration {value!r} is too long: at most 100 years (a date past it is no date)"
        )
    if seconds < 0:
        raise ValueError(f"negative duration {value!r}: a retention period must be more than 0")
    if seconds == 0:
        raise ValueError(
            f"duration {value!r}: a retention period must be more than 0 (without one, "
            f"documents are kept until erased: drop expire_after)"
        )
    return timedelta(seconds=seconds)


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)]
RoleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


def _field_path(value: str) -> str:
    if len(value) > 200 or not _FIELD_PATH.match(value):
        raise ValueError(
            f"{value!r} is not a field path: dotted field names (letters, digits, _ and -), "
            f"no '$', no empty parts (e.g. 'metadata.user_id')"
        )
    return value


FieldPath = Annotated[str, AfterValidator(_field_path)]


def check_collection_name(value: str) -> str:
    if (
        not value
        or len(value) > 120
        or "$" in value
        or "\x00" in value
        or value.startswith(".")
        or value.endswith(".")
    ):
        raise ValueError(
            f"{value!r} is not a collection name (1 to 120 characters, no '$' or NUL, not "
            f"starting or ending with '.')"
        )
    if value.startswith("system."):
        raise ValueError(f"{value!r}: system.* collections are MongoDB's own")
    return value


CollectionName = Annotated[str, AfterValidator(check_collection_name)]
Grants = dict[Name, list[Action]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def _none_is_empty(value: Any) -> Any:
    """``retention = "none"``: kept until erased."""
    return {} if value == "none" else value


class RetentionFile(_Strict):
    """A class's retention as a file writes it (every field optional)."""

    expire_after: Duration | None = None
    after: Event | None = None
    keep_latest: Annotated[int, Field(gt=0, le=1_000_000, strict=True)] | None = None


class Retention(RetentionFile):
    """How long a class's documents are kept. Nothing set: until erased."""

    def describe(self) -> str:
        parts = []
        if self.keep_latest is not None:
            parts.append(f"keep latest {self.keep_latest} per thread")
        if self.expire_after is not None:
            parts.append(f"expire {_human(self.expire_after)} after {self.after or 'created'}")
        return ", ".join(parts) or "until erased"


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit in ("y", "w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


class ClassPolicyFile(_Strict):
    """One class as a file writes it: what is given replaces the default's field whole
    (a ``roles`` table replaces the default roles of that class)."""

    collection: CollectionName | None = None
    roles: Grants | None = None
    principals: Grants | None = None
    retention: Annotated[RetentionFile | None, BeforeValidator(_none_is_empty)] = None
    audit: AuditMode | None = None
    subject_fields: list[FieldPath] | None = None
    encryption: EncryptionScope | None = None


class PolicyFile(_Strict):
    """A policy file: ``version``, ``custom_roles`` and ``[classes.NAME]`` tables."""

    version: Annotated[int, Field(ge=1, strict=True)] = 1
    custom_roles: list[RoleName] = Field(default_factory=list)
    classes: dict[str, ClassPolicyFile] = Field(default_factory=dict)


class ClassPolicy(_Strict):
    """The effective policy of one class (complete)."""

    name: str
    collection: str | None
    roles: dict[str, frozenset[Action]]
    principals: dict[str, frozenset[Action]]
    retention: Retention
    audit: AuditMode
    subject_fields: tuple[str, ...]
    encryption: EncryptionScope = "off"

    def allowed(self, role: str, principal: str) -> frozenset[Action]:
        """What ``principal`` (of ``role``) may do on this class."""
        by_role = self.roles.get(role, frozenset())
        by_name = self.principals.get(principal)
        return by_role | by_name if by_name else by_role

    def rule(self, role: str, principal: str) -> str:
        """The grant that applies to ``principal`` (of ``role``), in the file's words."""
        by_name = self.principals.get(principal)
        parts = [f"roles.{role} = {sorted(self.roles.get(role, ()))}"]
        if by_name:
            parts.append(f"principals.{principal!r} = {sorted(by_name)}")
        return f"[classes.{_quoted(self.name)}] " + ", ".join(parts)


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


class Policy(_Strict):
    """The effective policy: every class complete. ``source`` names where it came from
    (a file, or the built-in default)."""

    version: int
    source: str
    custom_roles: tuple[str, ...]
    classes: dict[str, ClassPolicy]

    def of(self, artifact: str, collection: str | None = None) -> ClassPolicy | None:
        """The policy of class ``artifact``; for a business class, that of
        ``business:COLLECTION`` when the policy names it, else ``business``'s. None: a
        class this policy does not know (refused by enforcement)."""
        if artifact == BUSINESS and collection is not None:
            named = self.classes.get(business_class(collection))
            if named is not None:
                return named
        return self.classes.get(artifact)

    def roles(self) -> tuple[str, ...]:
        """The roles this policy knows: the service roles and its custom roles."""
        return (*SERVICE_ROLES, *self.custom_roles)

    def table(self) -> Iterator[tuple[str, dict[str, str]]]:
        """Rows of the roles-by-classes table: class -> {role: 'f i u r' letters}."""
        for name, cls in self.classes.items():
            yield (
                name,
                {
                    role: "".join(a[0] for a in ACTIONS if a in cls.roles.get(role, ())) or "-"
                    for role in self.roles()
                },
            )


def business_class(collection: str) -> str:
    """The class name of business collection ``collection`` (``business:orders``)."""
    return f"{BUSINESS}:{collection}"


def class_of(name: str) -> str | None:
    """The registry class ``name`` is (``business:NAME`` -> ``business``); None if none."""
    if name in CLASSES:
        return name
    base, sep, rest = name.partition(":")
    if sep and base == BUSINESS and rest:
        return BUSINESS
    return None


def to_toml(policy: Policy) -> str:
    """``policy`` as a policy file naming every class (``accord governance show --toml``):
    read back with ``parse_policy(text, ..., base=None)`` it is the same policy."""
    lines = [f"# the effective policy, from {policy.source}", f"version = {policy.version}"]
    if policy.custom_roles:
        lines.append(f"custom_roles = {_toml_list(policy.custom_roles)}")
    for name, cls in policy.classes.items():
        lines += ["", f"[classes.{_quoted(name)}]"]
        if cls.collection is not None and not name.startswith(f"{BUSINESS}:"):
            lines.append(f"collection = {_toml_str(cls.collection)}")
        lines.append(f"audit = {_toml_str(cls.audit)}")
        if cls.subject_fields:
            lines.append(f"subject_fields = {_toml_list(cls.subject_fields)}")
        if cls.encryption != "off":
            lines.append(f"encryption = {_toml_str(cls.encryption)}")
        retention = cls.retention
        parts = []
        if retention.keep_latest is not None:
            parts.append(f"keep_latest = {retention.keep_latest}")
        if retention.expire_after is not None:
            parts.append(f"expire_after = {_toml_str(_human(retention.expire_after))}")
        if retention.after is not None:
            parts.append(f"after = {_toml_str(retention.after)}")
        lines.append("retention = " + ("{ " + ", ".join(parts) + " }" if parts else '"none"'))
        for table, grants in (("roles", cls.roles), ("principals", cls.principals)):
            body = ", ".join(
                f"{_toml_key(who)} = {_toml_list([a for a in ACTIONS if a in actions])}"
                for who, actions in grants.items()
            )
            lines.append(f"{table} = {{ {body} }}" if body else f"{table} = {{}}")
    return "\n".join(lines) + "\n"


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_key(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z0-9_-]+", value) else _toml_str(value)


def _toml_list(values: Iterator[str] | tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"
