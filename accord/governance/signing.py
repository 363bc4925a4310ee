"""Ed25519 signatures of digests and export manifests (the ``cryptography`` package).

A signature is ``{"alg": "Ed25519", "key_id": ..., "public_key": ..., "sig": ...}``
(base64 of the raw 32-byte public key and 64-byte signature; ``key_id`` the first 16
hex digits of the public key's SHA-256) over the RFC 8785 bytes of what is signed. The
public key travels with the signature so that a verifier can say which key signed;
trusting it is the verifier's choice: pin the key you keep (``--public-key``), or a
forger simply signs with a key of their own.

Keys: ``accord audit keygen PATH`` writes PATH (the private key, PKCS#8 PEM, mode 0600)
and PATH.pub (the public key, PEM). A command that signs takes ``--key PATH`` or
``--key-env NAME`` (an environment variable holding the PEM text).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from accord.errors import ConfigurationError, InvalidInputError
from accord.governance.canonical import canonical

__all__ = [
    "ALG", "generate", "key_id", "load_private", "load_public", "public_raw", "sign",
    "signature_problem",
]  # fmt: skip

ALG = "Ed25519"


def generate(path: Path) -> tuple[Path, Path]:
    """Write a new key pair: ``path`` (private, 0600) and ``path.pub``; refuses to
    overwrite an existing key."""
    pub = path.with_name(path.name + ".pub")
    for p in (path, pub):
        if p.exists():
            raise InvalidInputError(f"{p} exists; not overwriting a key (pick another path)")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise InvalidInputError(f"cannot write the key to {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path, pub


def load_private(path: Path | None = None, env: str | None = None) -> Ed25519PrivateKey | None:
    """The signing key from ``path`` or the environment variable ``env`` (PEM), or None
    when neither is given."""
    if path is None and env is None:
        return None
    if path is not None:
        try:
            pem = path.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read the signing key {path}: {exc}") from None
        where = str(path)
    else:
        text = os.environ.get(str(env))
        if not text:
            raise ConfigurationError(f"the environment variable {env} holds no signing key")
        pem, where = text.encode(), f"${env}"
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{where} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigurationError(f"{where} is not an Ed25519 key ({type(key).__name__})")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    """A public key (PEM, as ``keygen`` writes ``.pub``) to pin."""
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the public key {path}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigurationError(f"{path} is not an Ed25519 public key")
    return key


def public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    """A short name of a public key: its SHA-256's first 16 hex digits."""
    return hashlib.sha256(public_raw(key)).hexdigest()[:16]


def sign(key: Ed25519PrivateKey, value: Any) -> dict[str, str]:
    """The signature of ``value`` (its RFC 8785 bytes)."""
    public = key.public_key()
    return {
        "alg": ALG, "key_id": key_id(public),
        "public_key": base64.b64encode(public_raw(public)).decode(),
        "sig": base64.b64encode(key.sign(canonical(value))).decode(),
    }  # fmt: skip


def signature_problem(
    value: Any, signature: Mapping[str, Any], pinned: Ed25519PublicKey | None = None
) -> str | None:
    """Why ``signature`` is not a valid signature of ``value`` (by ``pinned`` when given),
    or None when it is."""
    if signature.get("alg") != ALG:
        return f"unknown signature algorithm {signature.get('alg')!r}"
    try:
        raw = base64.b64decode(str(signature["public_key"]), validate=True)
        sig = base64.b64decode(str(signature["sig"]), validate=True)
        public = Ed25519PublicKey.from_public_bytes(raw)
    except (KeyError, ValueError) as exc:
        return f"the signature is malformed ({exc})"
    if pinned is not None and public_raw(pinned) != raw:
        return f"signed by key {key_id(public)}, not by the pinned key {key_id(pinned)}"
    try:
        public.verify(sig, canonical(value))
    except InvalidSignature:
        return f"the signature by key {key_id(public)} does not match the content"
    return None
