"""API-key principals of the memory HTTP API: who calls, and which tenant they may see.

Every key belongs to one principal, and every principal to one tenant: the tenant of a
request is the key's, never anything the request says. Keys are configured in a file
(``ACCORD_API_KEYS_FILE``: TOML or JSON) or in the environment (``ACCORD_API_KEYS``:
JSON), as a list of principals::

    [[principals]]
    name = "support-bot"
    tenant = "acme"
    key_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    scopes = ["read", "write"]        # default: both

    expires_at = 2027-06-30T00:00:00Z # optional: refused from then on

``key_sha256`` is the SHA-256 (hex) of the key, so the file holds no secret; ``key`` (the
key itself) is accepted too, for development, and hashed when loaded. Generate keys with
``accord memory api-key``. Keys are at least 24 characters.

A keys file is read again when it changes (checked at most once a second, on the next
request): adding, revoking or letting a key expire needs no restart. A file that no
longer loads (a typo) is reported in the log and the keys loaded before stay in force
until it is fixed. Keys given in ``ACCORD_API_KEYS`` are read once.

Checking a key hashes it and compares the hash with EVERY principal's, with
``hmac.compare_digest``, without stopping at a match: the time taken does not depend on
which key matched or how much of it. Keys and their hashes are never logged or returned,
and :class:`AccessLogRedaction` keeps a key sent in a URL (refused: keys go in headers)
out of the server's access log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import tomllib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from accord.errors import ConfigurationError
from accord.memory import model

log = logging.getLogger("accord.memory.http")

Scope = Literal["read", "write"]
MIN_KEY_LENGTH = 24
#: What separates the words of a URL part (keys are URL-safe base64: letters, digits, _ -).
_WORDS = re.compile(r"[^A-Za-z0-9_\-]+")
KEYS_ENV = "ACCORD_API_KEYS"
KEYS_FILE_ENV = "ACCORD_API_KEYS_FILE"


def hash_key(key: str) -> str:
    """The SHA-256 (hex) under which a key is configured."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A new random API key (256 bits, URL-safe)."""
    return "acc_" + secrets.token_urlsafe(32)


class Principal(BaseModel):
    """One API key's owner: a name (for logs and audit), a tenant, scopes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    tenant: str
    scopes: frozenset[Scope] = frozenset({"read", "write"})
    key_sha256: str = Field(default="", repr=False)
    key: str | None = Field(default=None, repr=False, exclude=True)
    expires_at: datetime | None = Field(
        default=None, description="From this time on the key is refused (with a time zone)."
    )

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return model.check_tenant(value)

    @field_validator("expires_at")
    @classmethod
    def _zoned(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give expires_at a time zone, e.g. 2027-06-30T00:00:00Z")
        return value

    def expired(self, at: datetime | None = None) -> bool:
        return self.expires_at is not None and (at or datetime.now(UTC)) >= self.expires_at

    @model_validator(mode="after")
    def _hash(self) -> Principal:
        if self.key is not None:
            if len(self.key) < MIN_KEY_LENGTH:
                raise ValueError(
                    f"the key of {self.name!r} is shorter than {MIN_KEY_LENGTH} characters; "
                    f"generate one with `accord memory api-key`"
                )
            digest = hash_key(self.key)
            if self.key_sha256 and self.key_sha256 != digest:
                raise ValueError(f"{self.name!r} has both key and key_sha256, and they differ")
            object.__setattr__(self, "key_sha256", digest)
            object.__setattr__(self, "key", None)
        if len(self.key_sha256) != 64 or any(c not in "0123456789abcdef" for c in self.key_sha256):
            raise ValueError(
                f"{self.name!r} needs key_sha256: the 64 lower-case hex digits of the key's "
                f"SHA-256 (or key, for development)"
            )
        if not self.scopes:
            raise ValueError(f"{self.name!r} has no scopes; give it 'read' and/or 'write'")
        return self


def _checked(principals: Iterable[Principal]) -> tuple[list[Principal], list[bytes]]:
    loaded = list(principals)
    names = [p.name for p in loaded]
    if len(set(names)) != len(names):
        raise ConfigurationError("principal names must be unique")
    hashes = [p.key_sha256 for p in loaded]
    if len(set(hashes)) != len(hashes):
        raise ConfigurationError("two principals have the same key; give each its own")
    return loaded, [bytes.fromhex(h) for h in hashes]


class ApiKeys:
    """The configured principals; :meth:`authenticate` maps a presented key to one.

    Loaded :meth:`from_file`, the keys follow the file: it is read again when it changes
    (see the module docstring)."""

    #: Seconds between two looks at the keys file.
    RELOAD_EVERY = 1.0

    def __init__(self, principals: Iterable[Principal], *, source: Path | None = None) -> None:
        # One tuple, replaced whole on reload: a request in another thread sees the old
        # keys or the new ones, never a mix.
        self._state = _checked(principals)
        self.source = source
        self._stamp = _stamp(source) if source is not None else None
        self._next_look = time.monotonic() + self.RELOAD_EVERY
        self._lock = threading.Lock()

    @property
    def principals(self) -> list[Principal]:
        return self._state[0]

    def __len__(self) -> int:
        return len(self._state[0])

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal whose key ``presented`` is, or None (unknown, or expired).
        Constant time in the key."""
        self.reload_if_changed()
        if not presented:
            return None
        principals, digests = self._state
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found = -1
        for i, known in enumerate(digests):  # no early exit
            if hmac.compare_digest(digest, known):
                found = i
        if found < 0:
            return None
        who = principals[found]
        if who.expired():
            log.info("API key of %r refused: it expired at %s", who.name, who.expires_at)
            return None
        return who

    def reload_if_changed(self, *, now: bool = False) -> bool:
        """Read the keys file again if it changed since it was read (looked at once a
        second at most, or at once with ``now``). Returns whether keys were reloaded. A
        file that does not load (a typo) leaves the current keys in force (logged once per
        change of the file); a file removed or emptied revokes every key."""
        if self.source is None or (not now and time.monotonic() < self._next_look):
            return False
        with self._lock:
            self._next_look = time.monotonic() + self.RELOAD_EVERY
            stamp = _stamp(self.source)
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            if _removed_or_empty(self.source):  # an operator revoking every key at once
                self._state = ApiKeys([])._state
                log.warning(
                    "API keys file %s was removed or emptied: every key is refused until it "
                    "lists principals again", self.source,
                )  # fmt: skip
                return True
            try:
                fresh = ApiKeys.from_file(self.source)
            except ConfigurationError as exc:
                log.error(
                    "API keys file changed but does not load (%s); the %d keys loaded "
                    "before stay in force until it is fixed", exc, len(self),
                )  # fmt: skip
                return False
            self._state = fresh._state
            log.info("API keys reloaded from %s: %d principals", self.source, len(self))
            return True

    @classmethod
    def parse(cls, data: Any, source: str) -> ApiKeys:
        entries = data.get("principals") if isinstance(data, Mapping) else data
        if not isinstance(entries, list):
            raise ConfigurationError(
                f"{source}: expected a list of principals (or a 'principals' list), each "
                f"with name, tenant, key_sha256 and optional scopes"
            )
        loaded = []
        for i, entry in enumerate(entries):
            try:
                loaded.append(Principal.model_validate(entry))
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}"
                    for e in exc.errors(include_input=False, include_url=False)
                )
                raise ConfigurationError(f"{source}: principal #{i}: {problems}") from None
        return cls(loaded)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ApiKeys:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read API keys file {p}: {exc.strerror}") from exc
        try:
            data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(
                f"API keys file {p} is not valid {p.suffix[1:] or 'TOML'}: {exc}"
            ) from None
        loaded = cls.parse(data, str(p))
        return cls(loaded.principals, source=p)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiKeys:
        """From ``ACCORD_API_KEYS_FILE`` or ``ACCORD_API_KEYS``; an error when neither is set
        (an API without keys would be open to every caller)."""
        env = os.environ if environ is None else environ
        if env.get(KEYS_FILE_ENV):
            return cls.from_file(env[KEYS_FILE_ENV])
        if env.get(KEYS_ENV):
            try:
                data = json.loads(env[KEYS_ENV])
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"{KEYS_ENV} is not valid JSON: {exc.msg}") from None
            return cls.parse(data, KEYS_ENV)
        raise ConfigurationError(
            f"no API keys configured: set {KEYS_FILE_ENV} (a TOML/JSON file of principals) "
            f"or {KEYS_ENV} (JSON); create a key with `accord memory api-key`"
        )

    @staticmethod
    def add_to_file(path: str | os.PathLike[str], principal: Principal) -> None:
        """Add ``principal`` to the keys file at ``path`` (TOML, or JSON for ``.json``;
        created, readable by its owner only, when missing). The file is checked with the
        new entry before it is replaced, so it is never left half-written or invalid."""
        p = Path(path)
        entry = principal.model_dump(mode="json", exclude={"key"}, exclude_none=True)
        entry["scopes"] = sorted(entry["scopes"])
        try:
            text = p.read_text(encoding="utf-8") if p.exists() else ""
        except OSError as exc:
            raise ConfigurationError(f"cannot read API keys file {p}: {exc.strerror}") from exc
        try:
            new_text = _with_entry(text, entry, as_json=p.suffix == ".json")
            data = json.loads(new_text) if p.suffix == ".json" else tomllib.loads(new_text)
        except ValueError as exc:  # JSONDecodeError, TOMLDecodeError
            raise ConfigurationError(
                f"API keys file {p} does not parse ({exc}); fix it first"
            ) from None
        ApiKeys.parse(data, str(p))  # a duplicate name or key is refused before writing
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(new_text)
            if p.exists():
                os.chmod(tmp, p.stat().st_mode & 0o777)
            os.replace(tmp, p)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ConfigurationError(f"cannot write API keys file {p}: {exc.strerror}") from exc


def _with_entry(text: str, entry: dict[str, Any], *, as_json: bool) -> str:
    """A keys file's ``text`` with ``entry`` appended to its principals."""
    if as_json:
        data = json.loads(text) if text.strip() else {"principals": []}
        entries = data.get("principals") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise ValueError("expected a list of principals")
        entries.append(entry)
        return json.dumps(data, indent=2) + "\n"
    # JSON strings and lists of strings are valid TOML values.
    block = "".join(
        f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in entry.items() if v is not None
    )  # TOML has no null: an absent key is None
    if text and not text.endswith("\n"):
        text += "\n"
    return text + ("\n" if text else "") + "[[principals]]\n" + block


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a changed file: modification time, size, inode (None: it is gone)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _removed_or_empty(path: str | os.PathLike[str]) -> bool:
    try:
        return not Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return True
    except (OSError, UnicodeDecodeError):
        return False  # unreadable: from_file says why, and the keys loaded stay


class AccessLogRedaction(logging.Filter):
    """Keeps API keys sent in URLs out of the access log (uvicorn's ``uvicorn.access``).

    Keys are accepted only in headers, so a key in a URL is refused (401); but the server
    logs the URL of every request. This filter rewrites the logged URL: every query value
    of :data:`MIN_KEY_LENGTH` characters or more, and every path segment or query value
    that is a configured key, becomes ``<redacted>``. Installed on the access logger by
    :func:`accord.memory.http_api.create_app`; behind another server, add it to that
    server's access logger."""

    LOGGER = "uvicorn.access"

    def __init__(self, keys: ApiKeys) -> None:
        super().__init__()
        self.keys = keys

    @classmethod
    def install(cls, keys: ApiKeys) -> AccessLogRedaction:
        logger = logging.getLogger(cls.LOGGER)
        for existing in logger.filters:
            if isinstance(existing, cls) and existing.keys is keys:
                return existing
        made = cls(keys)
        logger.addFilter(made)
        return made

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) and "/" in a else a
                                for a in record.args)  # fmt: skip
        return True

    def redact(self, url: str) -> str:
        path, sep, query = url.partition("?")
        segments = ["<redacted>" if self._holds_key(unquote(s)) else s for s in path.split("/")]
        out = "/".join(segments)
        if sep:
            parts = []
            for item in query.split("&"):
                # a bare item (``?KEY``) is a value too; a name can be a key (``?KEY=1``)
                name, eq, value = item.partition("=") if "=" in item else ("", "", item)
                name = "<redacted>" if self._secret(name) else name
                value = "<redacted>" if self._secret(value) else value
                parts.append(f"{name}{eq}{value}")
            out += "?" + "&".join(parts)
        return out

    def _secret(self, text: str) -> bool:
        plain = unquote(text)
        return len(plain) >= MIN_KEY_LENGTH or self._holds_key(plain)

    def _holds_key(self, text: str) -> bool:
        """``text`` is a key or has one among its words (``KEY.json``, ``ns.KEY``)."""
        return self._is_key(text) or any(
            self._is_key(word) for word in _WORDS.split(text) if word != text
        )

    def _is_key(self, text: str) -> bool:
        if len(text) < MIN_KEY_LENGTH:
            return False
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        return any(hmac.compare_digest(digest, known) for known in self.keys._state[1])
