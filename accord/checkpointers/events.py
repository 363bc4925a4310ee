"""The checkpointer's public event contract: the outbox events its transactions write.

Consumers (the memory aggregator) read these names and shapes; they never import the
saver. Every event carries ``tenant_id`` and ``thread_id`` (besides the platform's
fields, docs/platform.md):

* ``checkpoint``: one per saved checkpoint: ``checkpoint_ns``, ``checkpoint_id``;
  ``messages`` (keys of the ``short_term_memory`` documents the step added) and
  ``configurable`` (the run's plain string config values, e.g. ``user_id``: what
  namespace templates such as ``("memories", "{user_id}")`` are filled from) when the
  step added messages;
* ``writes``: one per recorded task: ``checkpoint_ns``, ``checkpoint_id``, ``task_id``;
* ``thread_deleted``: ``delete_thread`` deleted the thread (not with
  ``keep_memories=True``, nor a ``ttl`` expiry): consumers remove what they derived
  from it.

Events are written only when a consumer is registered for the saver's outbox (see
:mod:`accord.checkpointers.asynchronous.outbox_gate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHECKPOINT = "checkpoint"
WRITES = "writes"
THREAD_DELETED = "thread_deleted"
#: Every kind the checkpointer writes.
KINDS = (CHECKPOINT, WRITES, THREAD_DELETED)

#: Field of a ``checkpoint`` event holding the run's plain config values.
CONFIGURABLE = "configurable"
#: Metadata keys that are LangGraph's own, not the run's configuration.
_NOT_CONFIG = frozenset({"source", "step", "parents", "run_id", "writes"})
#: Bounds on what an event carries of the configuration (namespace labels are at most
#: 256 characters; a config is a handful of keys).
MAX_KEYS = 32
MAX_VALUE = 256


def configurable_of(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The run's plain string configuration values in a checkpoint's metadata (LangGraph
    copies ``config["configurable"]``'s plain values there): what a consumer may fill
    namespace templates from. Keys must be plain names; values at most 256 characters."""
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if (
            isinstance(key, str)
            and key.isidentifier()
            and key not in _NOT_CONFIG
            and isinstance(value, str)
            and value
            and len(value) <= MAX_VALUE
        ):
            out[key] = value
            if len(out) == MAX_KEYS:
                break
    return out
