"""Deterministic document ids.

accord derives every ``_id`` from the document's natural key, so every insert is
idempotent: a retried transaction, a replayed call or a migration re-run writes the same
documents again instead of duplicates.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def doc_id(*parts: Any) -> str:
    """Deterministic ``_id`` for the natural key ``parts``.

    Hashing keeps ids short and unambiguous whatever characters the parts (thread ids,
    channel names, namespaces) contain.
    """
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()
