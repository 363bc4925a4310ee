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

``key_sha256`` is the SHA-256 (hex) of the key, so the file holds no secret; ``key`` (the
key itself) is accepted too, for development, and hashed when loaded. Generate keys with
``accord memory api-key``. Keys are at least 24 characters.

Checking a key hashes it and compares the hash with EVERY principal's, with
``hmac.compare_digest``, without stopping at a match: the time taken does not depend on
which key matched or how much of it. Keys and their hashes are never logged or returned.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from accord.errors import ConfigurationError
from accord.memory import model

log = logging.getLogger("accord.memory.http")

Scope = Literal["read", "write"]
MIN_KEY_LENGTH = 24
KEYS_ENV = "ACCORD_API_KEYS"
KEYS_FILE_ENV = "ACCORD_API_KEYS_FILE"


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
    block = "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in entry.items())
    if text and not text.endswith("\n"):
        text += "\n"
    return text + ("\n" if text else "") + "[[principals]]\n" + block


def _stamp(path: Path) -> tuple[int, int] | None:
    """(modification time in ns, size) of ``path``; None if it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


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

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return model.check_tenant(value)

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


class ApiKeys:
    """The configured principals; :meth:`authenticate` maps a presented key to one.

    Loaded :meth:`from_file`, the keys follow the file: a request after the file changed
    (its modification time or size) is checked against the new keys, so a key added by
    ``accord memory api-key --keys-file`` or removed by hand takes effect without a
    restart. A changed file that does not load keeps the previous keys (logged once).
    """

    def __init__(self, principals: Iterable[Principal]) -> None:
        self.principals = list(principals)
        names = [p.name for p in self.principals]
        if len(set(names)) != len(names):
            raise ConfigurationError("principal names must be unique")
        hashes = [p.key_sha256 for p in self.principals]
        if len(set(hashes)) != len(hashes):
            raise ConfigurationError("two principals have the same key; give each its own")
        self._digests = [bytes.fromhex(h) for h in hashes]
        self._source: Path | None = None
        self._stamp: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.principals)

    def _follow(self, path: Path) -> ApiKeys:
        self._source, self._stamp = path, _stamp(path)
        return self

    def _reload_if_changed(self) -> None:
        if self._source is None:
            return
        stamp = _stamp(self._source)
        if stamp == self._stamp:
            return
        self._stamp = stamp  # a broken file is reported once, not on every request
        try:
            fresh = ApiKeys.from_file(self._source)
        except ConfigurationError as exc:
            log.warning(
                "API keys file changed but does not load; keeping the previous keys: %s", exc
            )
            return
        self.principals, self._digests = fresh.principals, fresh._digests
        log.info("API keys reloaded from %s: %d principals", self._source, len(self.principals))

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal whose key ``presented`` is, or None. Constant time in the key."""
        if not presented:
            return None
        self._reload_if_changed()
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found = -1
        for i, known in enumerate(self._digests):  # no early exit
            if hmac.compare_digest(digest, known):
                found = i
        return self.principals[found] if found >= 0 else None

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
        return cls.parse(data, str(p))._follow(p)

    @staticmethod
    def add_to_file(path: str | os.PathLike[str], principal: Principal) -> None:
        """Add ``principal`` to the keys file at ``path`` (TOML, or JSON for ``.json``;
        created, readable by its owner only, when missing). The file is checked with the
        new entry before it is replaced, so it is never left half-written or invalid."""
        p = Path(path)
        entry = principal.model_dump(mode="json", exclude={"key"})
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
