"""Loading a policy file: TOML -> validated :class:`~accord.governance.policy.Policy`, or a
:class:`~accord.errors.PolicyError` naming the file and the line of every problem.

Three layers of checks, each reported with ``FILE:LINE: message``:

1. TOML syntax (``tomllib``'s own message carries the line);
2. shapes and values (pydantic): unknown keys, wrong types, unknown actions or audit
   modes, negative or malformed durations; pydantic's error locations are key paths,
   mapped back to lines by :mod:`accord.governance.toml_lines`;
3. meaning, on the effective policy (the file over the default): unknown artifact classes
   and roles, and contradictions (update or remove granted on audit records, retention of
   a class that goes with another, ``keep_latest`` on a class without versions, an event
   the class has no such thing as, one collection for two classes).

All problems of a file are reported at once, each on its own line.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from accord.errors import PolicyError
from accord.governance import default
from accord.governance.crypto import PAYLOADS
from accord.governance.policy import (
    BUSINESS,
    DEPENDENT,
    ClassPolicy,
    ClassPolicyFile,
    Policy,
    PolicyFile,
    Retention,
    RetentionFile,
    check_collection_name,
    class_of,
)
from accord.governance.retention import FINISHED, THREAD_CLASSES
from accord.governance.toml_lines import KeyPath, key_lines, line_of
from accord.platform.artifacts import CLASSES
from accord.platform.context import SERVICE_ROLES

#: accord's collection names start with this (the checkpointer's business writes refuse it).
ACCORD_PREFIX = "accord_"

#: The environment variable naming a policy file for every kernel of the process.
POLICY_ENV = "ACCORD_POLICY"

Problem = tuple[KeyPath, str]


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """The effective policy of the file at ``path`` (over the default). Raises
    :class:`~accord.errors.PolicyError` naming the file and line of every problem."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"policy file {where} cannot be read ({type(exc).__name__}: {exc}); "
            f"check the path (the {POLICY_ENV} variable or the policy= argument)",
            [(where, None, str(exc))],
        ) from None
    return parse_policy(text, where)


@functools.cache
def default_policy() -> Policy:
    """The built-in default policy (:mod:`accord.governance.default`)."""
    return parse_policy(default.DEFAULT_POLICY_TOML, default.SOURCE, base=None)


def parse_policy(
    text: str, source: str, *, base: Policy | Literal["default"] | None = "default"
) -> Policy:
    """The effective policy of TOML ``text`` read from ``source`` (a name for messages),
    over ``base`` (``"default"``: the built-in default policy; None: the text must name
    every class itself)."""
    over = default_policy() if base == "default" else base
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(found.group(1)) if found else getattr(exc, "lineno", None)
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", message)
        _refuse(source, [(source, line, f"not valid TOML: {reason}")])
    lines = key_lines(text)
    try:
        parsed = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        _refuse(source, [_pydantic_problem(source, lines, e) for e in exc.errors()])
    policy, problems = _effective(parsed, over, source)
    problems += _contradictions(policy, parsed)
    if problems:
        _refuse(source, [_located(source, lines, path, msg) for path, msg in problems])
    return policy


def _refuse(source: str, problems: list[tuple[str, int | None, str]]) -> Any:
    shown = "\n".join(
        f"  {where}:{line}: {message}" if line else f"  {where}: {message}"
        for where, line, message in problems
    )
    count = f"{len(problems)} problems" if len(problems) > 1 else "a problem"
    raise PolicyError(f"policy {source} was refused, {count}:\n{shown}", problems)


def _located(
    source: str, lines: dict[KeyPath, int], path: Iterable[str | int], message: str
) -> tuple[str, int | None, str]:
    key = tuple(path)
    return source, line_of(lines, key) or (1 if lines else None), f"{_dotted(key)}: {message}"


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f".{part}" if out else part
        else:
            out += f'."{part}"' if out else f'"{part}"'
    return out


def _pydantic_problem(
    source: str, lines: dict[KeyPath, int], error: Any
) -> tuple[str, int | None, str]:
    # pydantic's locations are key paths, plus markers of its own ("[key]" for a dict key,
    # a function-validator's name) that are not keys of the file
    path = tuple(
        p for p in error["loc"] if isinstance(p, int) or not (p.startswith("[") or "(" in p)
    )
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key (a misspelling?)" + _known_keys(path)
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    elif error["type"] == "literal_error":
        message = f"{message}, got {error.get('input')!r}"
    return _located(source, lines, path, message)


def _known_keys(path: KeyPath) -> str:
    """The keys allowed where ``path``'s last key was found (for an unknown key)."""
    parts = list(path[:-1])
    model: Any
    if not parts:
        model = PolicyFile
    elif parts[0] == "classes" and len(parts) == 2:
        model = ClassPolicyFile
    elif parts[0] == "classes" and parts[2:] == ["retention"]:
        model = RetentionFile
    else:
        return ""
    return f"; the keys here are {', '.join(sorted(model.model_fields))}"


def _effective(
    parsed: PolicyFile, base: Policy | None, source: str
) -> tuple[Policy, list[Problem]]:
    """The file over ``base``: what a class section gives replaces that field of the
    base's class; classes the file does not name are the base's."""
    problems: list[Problem] = []
    classes: dict[str, ClassPolicy] = dict(base.classes) if base else {}
    for name, given in parsed.classes.items():
        registry = class_of(name)
        if registry is None:
            problems.append(
                (
                    ("classes", name),
                    f"unknown artifact class {name!r}; the classes are "
                    f"{', '.join(CLASSES)}, and 'business:COLLECTION' for one business "
                    f"collection",
                )
            )
            continue
        start = classes.get(name) or (classes.get(BUSINESS) if registry == BUSINESS else None)
        collection = name.partition(":")[2] if registry == BUSINESS and name != BUSINESS else None
        if collection is not None:
            try:
                check_collection_name(collection)
            except ValueError as exc:
                problems.append((("classes", name), f"business class {name!r}: {exc}"))
                continue
        fields: dict[str, Any] = (
            {key: getattr(start, key) for key in ClassPolicy.model_fields}
            if start is not None
            else _empty(name)
        )
        fields["name"] = name
        if collection is not None:
            fields["collection"] = collection
        for key in given.model_fields_set:
            value = getattr(given, key)
            if key in ("roles", "principals"):
                fields[key] = {who: frozenset(actions) for who, actions in (value or {}).items()}
            elif key == "retention":
                fields[key] = Retention(**(value.model_dump() if value is not None else {}))
            elif key == "subject_fields":
                fields[key] = tuple(value or ())
            else:
                fields[key] = value
        if collection is not None and fields["collection"] != collection:
            problems.append(
                (
                    ("classes", name, "collection"),
                    f"business class {name!r} is the collection {collection!r}; it cannot "
                    f"name {fields['collection']!r} (drop the key, or rename the class)",
                )
            )
        classes[name] = ClassPolicy.model_validate(fields)
    missing = [c for c in CLASSES if c not in classes]
    if missing:
        problems.append(((), f"the policy names no rules for {', '.join(missing)}"))
    custom = (
        tuple(parsed.custom_roles)
        if "custom_roles" in parsed.model_fields_set or base is None
        else base.custom_roles
    )
    policy = Policy(version=parsed.version, source=source, custom_roles=custom, classes=classes)
    return policy, problems


def _empty(name: str) -> dict[str, Any]:
    return {
        "name": name, "collection": CLASSES[name].default_collection if name in CLASSES else None,
        "roles": {}, "principals": {}, "retention": Retention(), "audit": "metadata",
        "subject_fields": (),
    }  # fmt: skip


def _contradictions(policy: Policy, parsed: PolicyFile) -> list[Problem]:
    """What the effective policy says that cannot all be true, at the file's paths."""
    problems: list[Problem] = []
    for i, role in enumerate(parsed.custom_roles):
        if role in SERVICE_ROLES:
            problems.append(
                (("custom_roles", i), f"{role!r} is a service role already; list only your own")
            )
        elif role in parsed.custom_roles[:i]:
            problems.append((("custom_roles", i), f"{role!r} is listed twice"))
    known = set(policy.roles())
    owners: dict[str, str] = {}
    for name, cls in policy.classes.items():
        at = ("classes", name)
        registry = class_of(name) or name
        for role in cls.roles:
            if role not in known:
                problems.append(
                    (
                        (*at, "roles", role),
                        f"unknown role {role!r}; the roles are {', '.join(sorted(known))} "
                        f"(declare your own in custom_roles = [...])",
                    )
                )
        if registry in _ALWAYS_AUDITED and cls.audit == "off":
            problems.append(
                (
                    (*at, "audit"),
                    f"{name} changes are evidence (who placed a hold, destroyed a key, "
                    f"applied a policy): their audit cannot be off (metadata at least)",
                )
            )
        if registry == "encryption_key" and cls.audit == "full":
            problems.append(
                (
                    (*at, "audit"),
                    "a data key's image is the key itself (wrapped under the master key): "
                    "its records keep hashes only, so its audit is metadata, not full",
                )
            )
        if registry in _NO_RETENTION or registry == "audit":
            default_collection = CLASSES[registry].default_collection
            if cls.collection != default_collection:
                problems.append(
                    (
                        (*at, "collection"),
                        f"{name} is accord's own; its collection is {default_collection!r} "
                        f"(accord reads it there: holds, keys or digests moved elsewhere "
                        f"would be lost from sight)",
                    )
                )
        reserved = sorted(set(cls.subject_fields) & _NOT_SUBJECT_FIELDS)
        if reserved:
            problems.append(
                (
                    (*at, "subject_fields"),
                    f"{', '.join(reserved)} cannot name a data subject (an erasure by it "
                    f"would reach a whole tenant, or accord's bookkeeping)",
                )
            )
        if registry in ("audit", "audit_digest"):
            for table, grants in (("roles", cls.roles), ("principals", cls.principals)):
                for who, actions in grants.items():
                    bad = [a for a in ("update", "remove") if a in actions]
                    if bad:
                        problems.append(
                            (
                                (*at, table, who),
                                f"grants {' and '.join(bad)} on {name} records to {who!r}; "
                                f"{name} records are append-only, nobody may update or "
                                f"remove them (find and insert only)",
                            )
                        )
        problems += _retention_problems(name, registry, cls.retention, at)
        if cls.encryption != "off" and registry not in PAYLOADS:
            problems.append(
                (
                    (*at, "encryption"),
                    f"{name} has no payload fields accord encrypts; the classes that can be "
                    f"encrypted are {', '.join(PAYLOADS)} (docs/governance.md, "
                    f"'Encryption and crypto-shredding')",
                )
            )
        if cls.collection is not None:
            other = owners.get(cls.collection)
            if other is not None:
                # name the class whose collection the file set (the other is the default's)
                given = parsed.classes.get(other)
                first, second = (
                    (name, other)
                    if given is not None and "collection" in given.model_fields_set
                    else (other, name)
                )
                problems.append(
                    (
                        ("classes", second, "collection"),
                        f"collection {cls.collection!r} is the collection of class "
                        f"{first!r} already; each class needs its own collection (its own "
                        f"roles and retention)",
                    )
                )
            owners[cls.collection] = name
            problems += _side_collection_problems(name, registry, cls.collection, at)
    return problems


def _side_collections() -> dict[str, str]:
    """accord's collections that no class has by default (collection -> the class whose
    data they hold): audit records and heads, audit cuts and digest heads, hold fences."""
    from accord.governance import audit_cuts, audit_records, digests, hold_guard

    return {
        audit_records.RECORDS: "audit",
        audit_records.HEADS: "audit",
        audit_cuts.CUTS: "audit_digest",
        digests.DIGEST_HEADS: "audit_digest",
        hold_guard.FENCES: "hold",
    }


def _side_collection_problems(
    name: str, registry: str, collection: str, at: KeyPath
) -> list[Problem]:
    """A class may not take one of accord's collections as its own: roles, retention and
    TTL indexes of that class would reach accord's audit chain or its hold fences."""
    if registry == "business" and collection.startswith(ACCORD_PREFIX):
        return [
            (
                (*at, "collection"),
                f"business collection {collection!r}: names starting with "
                f"{ACCORD_PREFIX!r} are accord's own collections, which business writes "
                f"never target; name the application's collection",
            )
        ]
    owner = _side_collections().get(collection)
    if owner is not None and owner != registry:
        return [
            (
                (*at, "collection"),
                f"collection {collection!r} is accord's own (it holds {owner} data); "
                f"class {name!r} needs a collection of its own",
            )
        ]
    return []


#: accord's own classes, kept until accord itself removes them (with what removes them):
#: a TTL on them would lift holds, shred keys or revert the policy with no one asking.
_NO_RETENTION = {
    "catalog": "the catalog lives as long as the collections it names",
    "migration": "a migration's record lives as long as what it migrated",
    "policy": "the applied policy's versions are what every process enforces",
    "hold": "a hold lasts until it is released",
    "encryption_key": "a data key lasts until an erasure or a shredding destroys it",
    "audit_digest": "digests are what later digests are proved against",
}
#: The classes whose audit cannot be turned off (each change of them is evidence).
_ALWAYS_AUDITED = ("hold", "encryption_key", "policy")
#: Fields a subject cannot be found by (they name tenants, ids or accord's bookkeeping).
_NOT_SUBJECT_FIELDS = frozenset({"_id", "tenant_id", "expire_at", "held_expire_at", "_version"})


def _retention_problems(
    name: str, registry: str, retention: Retention, at: KeyPath
) -> list[Problem]:
    problems: list[Problem] = []
    here = (*at, "retention")
    given = retention.expire_after is not None or retention.keep_latest is not None
    if registry in _NO_RETENTION and given:
        return [(here, f"{name} takes no retention: {_NO_RETENTION[registry]}")]
    registered = CLASSES.get(registry)
    if (
        given
        and registry not in DEPENDENT  # (said below, naming the class it goes with)
        and registered is not None
        and registered.thread_scoped
        and registry not in THREAD_CLASSES
        and registry not in FINISHED
    ):
        return [
            (
                here,
                f"{name} goes with its thread (it is deleted when the thread is): set "
                f"retention on [classes.checkpoint], [classes.short_term_memory] or "
                f"[classes.run] instead",
            )
        ]
    parent = DEPENDENT.get(registry)
    if parent is not None and (retention.expire_after is not None or retention.keep_latest):
        problems.append(
            (
                here,
                f"{name} goes with its {parent} documents (a kept {parent} needs them): it "
                f"cannot expire on its own; set retention on [classes.{parent}] instead",
            )
        )
    if retention.keep_latest is not None and registry != "checkpoint":
        problems.append(
            (
                (*here, "keep_latest"),
                "keep_latest keeps the latest N checkpoints of each thread; only the "
                "checkpoint class has versions to keep (use expire_after here)",
            )
        )
    if retention.after is not None and retention.expire_after is None:
        problems.append(
            (
                (*here, "after"),
                f"after = {retention.after!r} says when expiry starts, but there is no "
                f"expire_after (add one, or drop after)",
            )
        )
    thread_scoped = registry in CLASSES and CLASSES[registry].thread_scoped
    if retention.after in ("last_activity", "thread_end") and not thread_scoped:
        problems.append(
            (
                (*here, "after"),
                f"{name} documents belong to no thread, so they have no "
                f"{retention.after!r}; use 'created' or 'updated'",
            )
        )
    if retention.after == "done" and registry not in FINISHED:
        problems.append(
            (
                (*here, "after"),
                f"only outbox events and queued runs are 'done'; {name} documents are not",
            )
        )
    if (
        registry == "queued_run"
        and retention.expire_after is not None
        and (retention.after != "done")
    ):
        problems.append(
            (
                (*here, "after"),
                "queued runs expire only once they ended (done, failed or cancelled): a "
                'queued, running or waiting run must never go; write after = "done"',
            )
        )
    return problems


PolicySource = Policy | str | os.PathLike[str] | None


def resolve_policy(policy: PolicySource = None) -> Policy:
    """The policy to enforce: ``policy`` itself, or the file it names, else the file named
    by ``ACCORD_POLICY``, else the built-in default. A file is read again only when it
    changed (its modification time or size), so building many kernels costs one parse."""
    if isinstance(policy, Policy):
        return policy
    path = policy if policy is not None else os.environ.get(POLICY_ENV, "").strip() or None
    if path is None:
        return default_policy()
    try:
        stat = os.stat(path)
    except OSError:
        return load_policy(path)  # raises the PolicyError naming the file
    return _cached(os.fspath(os.path.abspath(path)), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _cached(path: str, mtime_ns: int, size: int) -> Policy:
    return load_policy(path)
