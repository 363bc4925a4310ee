"""Message channels as chains of reference lists (pure functions, no I/O).

A message channel (``messages`` by default) is stored as ordered lists of message keys
(the messages themselves are short-term-memory documents, stored once). To keep even the
reference lists from growing quadratically, a channel's successive versions form a
*chain* of blobs; see the constants below and docs/checkpointer.md ("Storage model").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord.checkpointers import schema
from accord.checkpointers.serde import CorruptStateError


def group_fragments(
    docs: Iterable[Mapping[str, Any]], *key_fields: str
) -> dict[Any, list[Mapping[str, Any]]]:
    """Documents grouped by ``key_fields`` (one field: its value; several: a tuple)."""
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for d in docs:
        k = d[key_fields[0]] if len(key_fields) == 1 else tuple(d[f] for f in key_fields)
        out.setdefault(k, []).append(d)
    return out


#: A message channel's blob is a *segment* of a chain: the message keys appended since
#: the channel's previous version, with a pointer (``prev``) to that version's blob. Every
#: PAGE-th segment is a *page* instead: the keys appended since the previous page, pointing
#: to it. The chain starts with a full *snapshot* (``seq`` 0). A new snapshot (a new chain)
#: is written when there is no previous state, when the change is not an append (an edit or
#: a removal), or when the chain holds more than max(CHAIN_MIN, snapshot length) segments or
#: appended keys. So a step stores O(new messages) (plus a page every PAGE steps and a
#: snapshot of n keys after at least ~n/2 steps or appended keys: O(1) amortized), and a
#: reader at ``seq`` s needs the snapshot, the pages and the segments of its own page
#: window (at most PAGE - 1): ``slot`` (``<chain>/p`` for the snapshot and the pages,
#: ``<chain>/<seq // PAGE>`` for a segment) in those two values and ``seq <= s``, one
#: indexed lookup.
CHAIN_MIN = 64
PAGE = 32


def pages_slot(chain: str) -> str:
    return f"{chain}/p"


def window_slot(chain: str, seq: int) -> str:
    return f"{chain}/{seq // PAGE}"


@dataclass(frozen=True)
class RefState:
    """A message channel at one checkpoint: its ordered message keys, the key of its
    blob, and its place in a chain: ``chain`` (key of the chain's snapshot; None for a
    state read from the earlier layout, so the next change starts a chain), ``seq``,
    ``base_len`` (keys in the snapshot), and the last page (or the snapshot) at or before
    it: ``page_key``, ``page_len`` (keys up to it)."""

    refs: tuple[str, ...]
    key: str
    chain: str | None
    seq: int
    base_len: int
    page_key: str
    page_len: int

    def extended_by(self, refs: Sequence[str]) -> bool:
        """Whether ``refs`` can be stored as the next segment of this state's chain."""
        limit = max(CHAIN_MIN, self.base_len)
        n = len(self.refs)
        return (
            self.chain is not None
            and self.seq + 1 <= limit
            and len(refs) - self.base_len <= limit
            and tuple(refs[:n]) == self.refs
        )


def segment(state: RefState | None, key: str, refs: list[str]) -> tuple[dict[str, Any], RefState]:
    """(chain fields of the blob of ``refs`` at ``key``, the channel's new state)."""
    if state is None or not state.extended_by(refs):
        full = RefState(tuple(refs), key, key, 0, len(refs), key, len(refs))
        return {"chain": key, "seq": 0, "slot": pages_slot(key), "page": True, "refs": refs}, full
    assert state.chain is not None
    seq = state.seq + 1
    if seq % PAGE == 0:
        fields = {
            "chain": state.chain,
            "seq": seq,
            "slot": pages_slot(state.chain),
            "page": True,
            "prev": state.page_key,
            "refs": refs[state.page_len :],
        }
        return fields, RefState(tuple(refs), key, state.chain, seq, state.base_len, key, len(refs))
    fields = {
        "chain": state.chain,
        "seq": seq,
        "slot": window_slot(state.chain, seq),
        "prev": state.key,
        "refs": refs[len(state.refs) :],
    }
    new = RefState(
        tuple(refs), key, state.chain, seq, state.base_len, state.page_key, state.page_len
    )
    return fields, new


def walk(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[Mapping[str, Any]] | str:
    """The blobs of a message channel's chain, from ``doc`` down to its snapshot (following
    ``prev``; documents of an abandoned branch of the chain are never on that path), or
    the key of the first one missing from ``blobs``."""
    thread_id, ns = doc["thread_id"], doc["checkpoint_ns"]
    path = [doc]
    current = doc
    while True:
        if "chain" in current:
            link = current.get("prev") if current.get("seq") else None
        else:  # earlier layout: a snapshot, or a delta on a base snapshot
            link = current.get("base")
        if link is None:
            return path
        nxt = blobs.get((thread_id, ns, link))
        if not nxt:
            return str(link)
        current = nxt[0]
        path.append(current)


def refs_of(path: list[Mapping[str, Any]]) -> list[str]:
    top = path[0]
    if "chain" not in top and "base" in top:  # earlier layout: a prefix of the base
        return list(path[1].get("refs") or ())[: top["base_len"]] + list(top.get("refs") or ())
    return [r for d in reversed(path) for r in d.get("refs") or ()]


def checked_walk(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[Mapping[str, Any]]:
    path = walk(doc, blobs)
    if isinstance(path, str):
        raise CorruptStateError(f"message refs {doc['key']}: blob {path} of its chain is missing")
    return path


def full_refs(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[str]:
    """The ordered message keys of a message-channel blob (following its chain)."""
    return refs_of(checked_walk(doc, blobs))


def ref_state(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> RefState:
    """The :class:`RefState` of a message-channel blob (to seed the saver's cache)."""
    path = checked_walk(doc, blobs)
    refs = tuple(refs_of(path))
    if "chain" not in doc:
        return RefState(refs, doc["key"], None, 0, len(refs), doc["key"], len(refs))
    # the last page (or the snapshot) on the path, and the keys up to it
    after = 0
    page = path[-1]
    for d in path:
        if d.get("page") or not d.get("seq"):
            page = d
            break
        after += len(d.get("refs") or ())
    return RefState(
        refs,
        doc["key"],
        doc["chain"],
        int(doc.get("seq") or 0),
        len(path[-1].get("refs") or ()),
        page["key"],
        len(refs) - after,
    )


def missing_links(
    blob_docs: Iterable[Mapping[str, Any]], roots: Iterable[tuple[str, str, str]]
) -> dict[tuple[str, str], tuple[set[str], dict[str, set[int]]]]:
    """What the message-ref blobs ``roots`` ((thread, ns, key) of the channel versions
    being read) still need beyond ``blob_docs``, per (thread, ns): (keys of base snapshots
    of the earlier layout, chain -> ``seq``s of its readers)."""
    blobs = group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
    out: dict[tuple[str, str], tuple[set[str], dict[str, set[int]]]] = {}
    for root in roots:
        frags = blobs.get(root)
        if not frags or frags[0].get("type") != schema.MSGREFS_TYPE:
            continue
        d = frags[0]
        missing = walk(d, blobs)
        if not isinstance(missing, str):
            continue
        keys, chains = out.setdefault((d["thread_id"], d["checkpoint_ns"]), (set(), {}))
        if "chain" in d:
            chains.setdefault(d["chain"], set()).add(int(d["seq"]))
        else:
            keys.add(missing)
    return out


def message_keys(
    blob_docs: Iterable[Mapping[str, Any]], roots: Iterable[tuple[str, str, str]]
) -> dict[str, set[str]]:
    """Message keys (per thread) of the message-ref blobs ``roots``, along their chains."""
    blobs = group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
    out: dict[str, set[str]] = {}
    for root in roots:
        frags = blobs.get(root)
        if not frags or frags[0].get("type") != schema.MSGREFS_TYPE:
            continue
        path = walk(frags[0], blobs)
        if isinstance(path, str):
            continue  # reported when the tuple is built
        keys = out.setdefault(root[0], set())
        for d in path:
            keys.update(d.get("refs") or ())
    return out


def chain_clause(chains: Mapping[str, Iterable[int]]) -> dict[str, Any] | None:
    """Filter (within one thread and namespace) of the chain documents that readers at
    the given ``seq``s of the given chains need: one indexed lookup (documents beyond what
    one reader needs are harmless: the walk from its own blob ignores them)."""
    slots: set[str] = set()
    top = 0
    for chain, seqs in chains.items():
        wanted = [s for s in seqs if s > 0]
        if wanted:
            slots.add(pages_slot(chain))
            slots.update(window_slot(chain, s) for s in wanted)
            top = max(top, *wanted)
    if not slots:
        return None
    return {"slot": {"$in": sorted(slots)}, "seq": {"$lte": top}}


def chain_closure(referenced: set[str], links: Mapping[str, str | None]) -> set[str]:
    """``referenced`` plus every blob key their message-ref chains point to (``links``:
    key -> ``prev``/``base`` of each message-ref blob)."""
    out = set(referenced)
    stack = [k for k in referenced if links.get(k)]
    while stack:
        nxt = links.get(stack.pop())
        if nxt and nxt not in out:
            out.add(nxt)
            stack.append(nxt)
    return out
