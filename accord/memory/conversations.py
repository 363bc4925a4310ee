"""What an outbox event's messages are, read back from short-term memory (pure).

The aggregator reads an event's new messages by key; a key that is not a string, or a
stored message whose ``created_at`` is not a date, is skipped with a reason (never the
whole event: one bad message must not dead-letter the others).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from accord.memory import model
from accord.memory.extraction import Conversation, Turn

#: The fields of a short-term-memory document the aggregator reads.
MESSAGE_FIELDS = {"key": 1, "chunk": 1, "message_id": 1, "role": 1, "text": 1, "created_at": 1}


def message_keys(listed: Any) -> tuple[list[str], list[str]]:
    """(the keys to read, why listed entries were skipped)."""
    keys: list[str] = []
    skipped: list[str] = []
    for i, k in enumerate(listed or []):
        if isinstance(k, str):
            keys.append(k)
        else:
            skipped.append(f"messages[{i}] is {type(k).__name__} {k!r:.40}, not a message key")
    return keys, skipped


def conversation_of(
    tenant_id: str,
    event: Mapping[str, Any],
    keys: Sequence[str],
    found: Sequence[Mapping[str, Any]],
    skipped: list[str],
) -> tuple[Conversation, int]:
    """The conversation of the messages ``found`` for ``keys`` (in the event's order), and
    how many of them are gone; messages that cannot be read are added to ``skipped``."""
    by_key = {d["key"]: d for d in found if d.get("chunk", 0) == 0 and "message_id" in d}
    turns = []
    for k in keys:
        d = by_key.get(k)
        if d is None:
            continue
        created = d.get("created_at")
        if created is not None and not isinstance(created, datetime):
            skipped.append(
                f"message {k!r:.60}: created_at is {type(created).__name__} "
                f"{created!r:.40}, not a date"
            )
            continue
        text = d.get("text")
        turns.append(Turn(
            message_id=str(d["message_id"]), role=str(d.get("role", "")),
            text=text if isinstance(text, str) else None,
            created_at=model.aware(created), key=k,
        ))  # fmt: skip
    checkpoint_id = event.get("checkpoint_id")
    conversation = Conversation(
        tenant_id=tenant_id,
        thread_id=str(event.get("thread_id")),
        turns=turns,
        checkpoint_ns=str(event.get("checkpoint_ns") or ""),
        checkpoint_id=checkpoint_id if isinstance(checkpoint_id, str) else None,
    )
    return conversation, sum(1 for k in keys if k not in by_key)
