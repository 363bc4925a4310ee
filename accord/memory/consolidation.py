"""Consolidation: what one event's changes do to the memories that exist.

Given an extractor's :class:`~accord.memory.extraction.Change` s (embedded), the
:class:`Consolidator` decides, memory by memory, what the event's transaction writes:

- an ``add`` whose key names a memory that exists (a slot such as ``profile:name``, the
  same statement made again, the thread's episode) updates that memory, or does nothing
  when nothing changed; episodes merge their turns (:func:`~accord.memory.extraction.merge_episode`);
- an ``add`` that has no key of its own is compared with the memories of the same kind in
  its namespace (``$vectorSearch``, then the exact cosine of the vectors): above
  ``threshold`` it *merges* into the closest one (the new statement's text replaces the
  old; the old version goes to history); otherwise it is a new memory. Changes of the same
  event are compared with each other too;
- ``update`` and ``delete`` act on the memory they name.

Several changes of one event that touch one memory collapse into one new version. The
result (:class:`Decisions`) says, per memory, the document before (None: new) and after
(None: deleted); the aggregator turns it into a plan whose writes are compare-and-set on
the version it read, so a concurrent writer makes the transaction fail and the event is
decided again, never half-applied.

The consolidator reads and embeds through functions it is given (``load`` by id,
``similar`` by vector, ``embed`` texts in one batch), so it is tested without a database.
Texts are embedded twice at most per event: the new statements (to find their
neighbours), then the final texts that are new (a merged episode's summary).

This module holds what both twins share (the data, the vector helpers, the callback
types); the consolidator itself is written once, async, as ``AsyncConsolidator``
(:mod:`accord.memory.asynchronous.consolidation`, awaiting its callbacks), and
``Consolidator`` (:mod:`accord.memory.synchronous.consolidation`) is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accord.memory.extraction import Change, content_key

Doc = dict[str, Any]
#: What the consolidator reads and embeds through: memories by id, the nearest memories
#: of a kind in a namespace, vectors of texts (the sync twin's, then the async one's).
Load = Callable[[Sequence[str]], Mapping[str, Doc]]
Similar = Callable[[tuple[str, ...], str, Sequence[float], int], list[Doc]]
Embed = Callable[[Sequence[str]], list[list[float]]]
AsyncLoad = Callable[[Sequence[str]], Awaitable[Mapping[str, Doc]]]
AsyncSimilar = Callable[[tuple[str, ...], str, Sequence[float], int], Awaitable[list[Doc]]]
AsyncEmbed = Callable[[Sequence[str]], Awaitable[list[list[float]]]]

#: Cosine similarity above which two memories of one kind and namespace are one memory.
DEFAULT_THRESHOLD = 0.85
#: Neighbours looked at per new memory.
NEIGHBOURS = 5


@dataclass(frozen=True)
class Prepared:
    """A change with its place: the namespace and key it goes to (key None: derived)."""

    change: Change
    namespace: tuple[str, ...]
    key: str | None


@dataclass
class Decisions:
    """Per memory id: the document read (None: did not exist) and the one to write (None:
    delete); ``label`` says why (``add``, ``update``, ``merge``, ``delete``)."""

    before: dict[str, Doc | None] = field(default_factory=dict)
    after: dict[str, Doc | None] = field(default_factory=dict)
    label: dict[str, str] = field(default_factory=dict)
    #: namespaces where a new memory was compared with its neighbours (their heads are
    #: compare-and-set so two workers cannot both add near-duplicates there)
    compared: set[tuple[str, ...]] = field(default_factory=set)

    def changed(self) -> list[str]:
        """Ids whose document changes (in the order they were first touched)."""
        return [i for i in self.after if _differs(self.before.get(i), self.after[i])]


def cosine(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = float(np.linalg.norm(va)), float(np.linalg.norm(vb))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(va @ vb / (na * nb))


def stored_vector(doc: Mapping[str, Any]) -> list[float] | None:
    """The embedding of a stored memory as floats (it is stored as a BSON vector)."""
    raw = doc.get("embedding")
    if raw is None:
        return None
    if hasattr(raw, "as_vector"):
        return [float(x) for x in raw.as_vector().data]
    return [float(x) for x in raw]


def own_key(change: Change) -> str:
    """The key of a change that names none: derived from its kind and text."""
    return change.key or content_key(change.kind, change.text)


def _differs(before: Doc | None, after: Doc | None) -> bool:
    if before is None or after is None:
        return before is not after
    return True  # _write only records real changes
