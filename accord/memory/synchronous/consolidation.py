# Generated from accord/memory/asynchronous/consolidation.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The consolidator: decides what one event's changes do to the memories that exist.

What it decides, and why, is in :mod:`accord.memory.consolidation` (with the data it
decides into). It reads and embeds only through the functions it is given, awaited here.

Generated from ``accord/memory/asynchronous/consolidation.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from accord.memory import model
from accord.memory.consolidation import (
    DEFAULT_THRESHOLD,
    NEIGHBOURS,
    Decisions,
    Doc,
    Embed,
    Load,
    Prepared,
    Similar,
    cosine,
    own_key,
    stored_vector,
)
from accord.memory.extraction import EPISODE, Change, episode_text, merge_episode

_IS_SYNC = True


class Consolidator:
    """Decides one event's writes (see the module docstring)."""

    def __init__(
        self,
        tenant_id: str,
        *,
        load: Load,
        similar: Similar,
        embed: Embed,
        threshold: float = DEFAULT_THRESHOLD,
        now: datetime,
        provenance: Callable[[Change], model.Provenance],
    ) -> None:
        self.tenant_id = tenant_id
        self.load = load
        self.similar = similar
        self.embed = embed
        self.threshold = threshold
        self.now = now
        self.provenance = provenance
        self.decisions = Decisions()
        self._embedded: dict[str, list[float]] = {}

    def _embed(self, texts: Sequence[str]) -> None:
        todo = list(dict.fromkeys(t for t in texts if t not in self._embedded))
        if todo:
            for text, vector in zip(todo, self.embed(todo), strict=True):
                self._embedded[text] = vector

    def decide(self, prepared: Sequence[Prepared]) -> Decisions:
        """Decide every change, then embed the texts that will be written."""
        self._embed([p.change.text for p in prepared
                     if p.change.action == "add" and p.key is None and p.change.merge])  # fmt: skip
        ids = [
            model.memory_id(self.tenant_id, p.namespace, p.key or own_key(p.change))
            for p in prepared
        ]
        found = self.load(ids)
        for i in ids:
            if i not in self.decisions.before:
                doc = found.get(i)
                self.decisions.before[i] = (
                    doc if doc is not None and model.live(doc, self.now) else None
                )
        for p in prepared:
            self._apply(p)
        written = {i: d for i, d in self.decisions.after.items() if d is not None and d.get("text")}
        reuse = {}
        for i, doc in written.items():
            before = self.decisions.before.get(i)
            if before is not None and before.get("text") == doc["text"] and "embedding" in before:
                reuse[i] = before["embedding"]  # same text: no need to embed it again
        self._embed([d["text"] for i, d in written.items() if i not in reuse])
        for i, doc in written.items():
            doc["embedding"] = reuse.get(i) or model.as_vector(self._embedded[doc["text"]])
        return self.decisions

    # -- one change -----------------------------------------------------------------------

    def _current(self, _id: str) -> Doc | None:
        if _id in self.decisions.after:
            return self.decisions.after[_id]
        return self.decisions.before.get(_id)

    def _apply(self, p: Prepared) -> None:
        c = p.change
        if c.action == "delete":
            _id = model.memory_id(self.tenant_id, p.namespace, p.key or "")
            if self._current(_id) is not None:
                self._set(_id, None, "delete")
            return
        own = p.key or own_key(c)
        _id = model.memory_id(self.tenant_id, p.namespace, own)
        current = self._current(_id)
        if (
            current is not None
            and p.key is None
            and c.action == "add"
            and self._same_thread(current, c)
        ):
            return  # the same statement (same normalised text) again: nothing new
        if current is not None or p.key is not None or c.action == "update" or not c.merge:
            self._write(_id, p, own, current, "update" if current is not None else "add")
            return
        # A new statement without a slot: merge into a near-duplicate if there is one.
        target = self._neighbour(p)
        if target is None:
            self._write(_id, p, own, None, "add")
        else:
            self._write(target["_id"], p, target["key"], target, "merge")

    def _neighbour(self, p: Prepared) -> Doc | None:
        vector = self._embedded[p.change.text]
        self.decisions.compared.add(p.namespace)
        best: tuple[float, Doc] | None = None
        pool: dict[str, Doc] = {}
        for doc in self.similar(p.namespace, p.change.kind, vector, NEIGHBOURS):
            if tuple(doc["namespace"]) == p.namespace and doc.get("kind") == p.change.kind:
                self.decisions.before.setdefault(doc["_id"], doc)
                current = self._current(doc["_id"])
                if current is not None:
                    pool[doc["_id"]] = current
        for _id, mine in self.decisions.after.items():  # this event's own new memories
            if (
                mine is not None
                and tuple(mine["namespace"]) == p.namespace
                and mine.get("kind") == p.change.kind
            ):
                pool[_id] = mine
        for doc in pool.values():
            other = self._embedded.get(doc.get("text") or "") or stored_vector(doc)
            if other is None:
                continue
            score = cosine(vector, other)
            if score >= self.threshold and (best is None or score > best[0]):
                best = (score, doc)
        return None if best is None else best[1]

    def _write(self, _id: str, p: Prepared, key: str, current: Doc | None, label: str) -> None:
        c = p.change
        value: dict[str, Any] = dict(c.value) if c.value is not None else {"content": c.text}
        text = c.text
        if c.kind == EPISODE and current is not None:
            value = merge_episode(current.get("value"), value)
            text = episode_text(str(value.get("thread_id") or ""), value["turns"])
        if (
            current is not None
            and current.get("text") == text
            and current.get("value") == value
            and current.get("kind") == c.kind
            and self._same_thread(current, c)
        ):
            return  # nothing new: the same memory again (a replayed step, a repeated fact)
        # (stated again by another thread: a version of its own, so that forgetting the
        # first thread keeps the memory, which the other thread states too)
        original = self.decisions.before.get(_id)
        req = model.PutRequest(
            tuple(current["namespace"]) if current is not None else p.namespace,
            key,
            value,
            text=text,
            kind=c.kind,
            provenance=self.provenance(c),
        )
        doc = model.new_document(self.tenant_id, req, self.now, original)
        self._set(_id, doc, label)

    def _same_thread(self, current: Doc, change: Any) -> bool:
        """Whether ``current``'s version came from the thread ``change`` comes from."""
        stated = (current.get("provenance") or {}).get("thread_id")
        return bool(stated == self.provenance(change).thread_id)

    def _set(self, _id: str, doc: Doc | None, label: str) -> None:
        self.decisions.after[_id] = doc
        previous = self.decisions.label.get(_id)
        # "add" then "merge" within one event is still an add; a delete wins.
        if previous == "add" and doc is not None:
            return
        self.decisions.label[_id] = label
