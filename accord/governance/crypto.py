"""The cryptography of encrypted classes: the master key, data keys, and the envelope.

* The **master key** comes from the environment (``ACCORD_MASTER_KEY``: 32 random bytes,
  base64); it never reaches the database. It wraps the data keys (AES-256-GCM) and keys
  the HMAC that names them.
* A **data key** (32 random bytes) encrypts the payloads of one scope: a tenant, a
  thread, or a data subject's value. It is stored wrapped, in a document of the
  ``encryption_key`` class (``accord_keys``), whose ``_id`` is an HMAC of the scope under
  the master key (so the collection does not list identifiers in its ids) and whose
  ``kid`` (random) is what ciphertexts name. Deleting that document destroys every copy
  of what it encrypted, in backups and exports too (crypto-shredding).
* An **envelope** replaces one field's value: ``Binary`` of subtype 0x80 (user defined)
  holding ``MAGIC | kid (16) | nonce (12) | AES-256-GCM(BSON {"v": value})``. The
  associated data binds it to its collection, its document's ``_id``, its field and its
  key: moved anywhere else, or altered, it does not decrypt.

The payload fields of each class that can be encrypted are :data:`PAYLOADS`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.binary import Binary
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from accord.errors import EncryptionError, MasterKeyError

__all__ = [
    "ENVELOPE_SUBTYPE", "MASTER_KEY_ENV", "PAYLOADS", "MasterKey", "decrypt_value",
    "encrypt_value", "envelope_kid", "is_envelope", "new_data_key",
]  # fmt: skip

#: The environment variable holding the master key (base64 of 32 random bytes).
MASTER_KEY_ENV = "ACCORD_MASTER_KEY"
#: The master key being rotated out: it only unwraps data keys not yet re-wrapped.
PREVIOUS_MASTER_KEY_ENV = "ACCORD_MASTER_KEY_PREVIOUS"
#: The BSON binary subtype of an envelope (0x80: user defined).
ENVELOPE_SUBTYPE = 0x80
MAGIC = b"acE1"
_KID = 16
_NONCE = 12

#: The fields of each class whose values are encrypted (dotted paths; a value of any BSON
#: type). What is not here stays in clear: ids, thread ids, tenant ids, namespaces, keys,
#: timestamps, a checkpoint's plain metadata copy ``meta`` (``list`` filters and subject
#: lookups read it), vectors.
PAYLOADS: Mapping[str, tuple[str, ...]] = {
    "checkpoint": ("checkpoint.data", "metadata.data"),
    "checkpoint_blob": ("data",),
    "checkpoint_write": ("data",),
    "short_term_memory": ("data", "text"),
    "long_term_memory": ("value", "text"),
    "memory_history": ("value", "text"),
}


@dataclass(frozen=True)
class MasterKey:
    """The master key (never stored): wraps data keys and names them. ``previous``: the
    master key being rotated out, which still unwraps the data keys wrapped under it
    (until ``accord governance rewrap-keys`` re-wrapped them)."""

    secret: bytes = field(repr=False)
    previous: MasterKey | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MasterKey | None:
        """The key in ``ACCORD_MASTER_KEY`` (with ``ACCORD_MASTER_KEY_PREVIOUS`` as its
        previous one, when set); None when unset. Malformed: MasterKeyError."""
        env = environ if environ is not None else os.environ
        raw = env.get(MASTER_KEY_ENV, "").strip()
        if not raw:
            return None
        old = env.get(PREVIOUS_MASTER_KEY_ENV, "").strip()
        previous = cls.parse(old, PREVIOUS_MASTER_KEY_ENV) if old else None
        key = cls.parse(raw)
        return cls(key.secret, previous) if previous is not None else key

    @classmethod
    def parse(cls, text: str, name: str = MASTER_KEY_ENV) -> MasterKey:
        """A master key from its base64 text (32 bytes once decoded); ``name`` says where
        it came from in an error."""
        try:
            secret = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise MasterKeyError(
                f"{name} is not base64; it must hold 32 random bytes in base64 "
                f'(make one with: python -c "import os,base64;print(base64.b64encode('
                f'os.urandom(32)).decode())"). Nothing was read or written'
            ) from None
        if len(secret) != 32:
            raise MasterKeyError(
                f"{name} decodes to {len(secret)} bytes; it must be 32 random bytes "
                f"(AES-256), base64. Nothing was read or written"
            )
        return cls(secret)

    @classmethod
    def generate(cls) -> MasterKey:
        return cls(secrets.token_bytes(32))

    def text(self) -> str:
        return base64.b64encode(self.secret).decode()

    @property
    def fingerprint(self) -> str:
        """Names this master key in the data keys it wraps (not secret)."""
        return hashlib.sha256(b"accord-master-id\x00" + self.secret).hexdigest()[:16]

    def key_id(self, scope: tuple[str, ...]) -> str:
        """The ``_id`` of the data key of ``scope`` (an HMAC: no identifier in clear)."""
        mac = hmac.new(self.secret, b"accord-key-id\x00" + _scope_bytes(scope), hashlib.sha256)
        return "k-" + mac.hexdigest()[:40]

    def wrap(self, kid: str, tenant_id: str, key: bytes) -> Binary:
        nonce = secrets.token_bytes(_NONCE)
        return Binary(nonce + AESGCM(self.secret).encrypt(nonce, key, _wrap_aad(kid, tenant_id)))

    def unwrap(self, doc: Mapping[str, Any]) -> bytes:
        """The data key of key document ``doc`` (under the previous master key when it
        was wrapped under that one)."""
        kid = str(doc.get("kid"))
        previous = self.previous
        if previous is not None and doc.get("master") == previous.fingerprint:
            return previous.unwrap(doc)
        if doc.get("master") not in (None, self.fingerprint):
            raise MasterKeyError(
                f"data key {kid} was wrapped under master key {doc.get('master')}, and "
                f"{MASTER_KEY_ENV} holds master key {self.fingerprint}: set the master key "
                f"the data was encrypted under. Nothing was decrypted"
            )
        blob = bytes(doc.get("wrapped") or b"")
        try:
            return AESGCM(self.secret).decrypt(
                blob[:_NONCE], blob[_NONCE:], _wrap_aad(kid, str(doc.get("tenant_id")))
            )
        except (InvalidTag, ValueError):
            raise MasterKeyError(
                f"data key {kid} does not unwrap under {MASTER_KEY_ENV} (another master key, "
                f"or the key document was altered). Nothing was decrypted"
            ) from None


def _scope_bytes(scope: tuple[str, ...]) -> bytes:
    return json.dumps(list(scope), separators=(",", ":"), ensure_ascii=False).encode()


def _wrap_aad(kid: str, tenant_id: str) -> bytes:
    return b"accord-wrap-v1\x00" + kid.encode() + b"\x00" + tenant_id.encode()


def new_data_key() -> tuple[str, bytes]:
    """A new data key: (kid, 32 random bytes)."""
    return secrets.token_hex(_KID), secrets.token_bytes(32)


@functools.lru_cache(maxsize=4096)
def _cipher(key: bytes) -> AESGCM:
    """One AES-GCM object per data key (they are reused by every value of the key)."""
    return AESGCM(key)


def _aad(collection: str, doc_id: Any, field: str, kid: bytes) -> bytes:
    return b"\x00".join(
        (b"accord-enc-v1", collection.encode(), bson.encode({"_id": doc_id}), field.encode(), kid)
    )


def encrypt_value(
    value: Any, *, kid: str, key: bytes, collection: str, doc_id: Any, field: str
) -> Binary:
    """``value`` as an envelope bound to (collection, document, field, key)."""
    raw_kid = bytes.fromhex(kid)
    nonce = secrets.token_bytes(_NONCE)
    sealed = _cipher(key).encrypt(
        nonce, bson.encode({"v": value}), _aad(collection, doc_id, field, raw_kid)
    )
    return Binary(MAGIC + raw_kid + nonce + sealed, ENVELOPE_SUBTYPE)


def is_envelope(value: Any) -> bool:
    return (
        isinstance(value, Binary)
        and value.subtype == ENVELOPE_SUBTYPE
        and bytes(value[: len(MAGIC)]) == MAGIC
    )


def envelope_kid(value: Binary) -> str:
    """The kid an envelope names."""
    return bytes(value[len(MAGIC) : len(MAGIC) + _KID]).hex()


def decrypt_value(value: Binary, *, key: bytes, collection: str, doc_id: Any, field: str) -> Any:
    """The value inside an envelope; EncryptionError when it does not belong here."""
    data = bytes(value)
    at = len(MAGIC)
    raw_kid = data[at : at + _KID]
    nonce = data[at + _KID : at + _KID + _NONCE]
    try:
        plain = _cipher(key).decrypt(
            nonce, data[at + _KID + _NONCE :], _aad(collection, doc_id, field, raw_kid)
        )
    except (InvalidTag, ValueError):
        raise EncryptionError(
            f"the encrypted {field!r} of document {doc_id!r} in {collection!r} does not "
            f"decrypt: it was moved from another document, collection or field, or altered. "
            f"Nothing was returned; restore the document from a good copy"
        ) from None
    return bson.decode(plain)["v"]
