"""A Merkle tree as RFC 6962 / RFC 9162 define it (Certificate Transparency), over a
list of leaves given at once.

A digest commits to the heads of all audit streams at one moment; the next digest is a
new tree over the new heads, not an extension of the previous tree (a stream's head
moves, so its leaf changes). What carries history from one digest to the next is each
stream's hash chain, not the tree: so the tree needs no append-only log, no
consistency proofs between tree sizes and no storage, which is what ``pymerkle`` (an
append-only log with a backing store) is built around. What is needed is 60 lines:

- ``MTH({}) = SHA-256()``; a leaf is ``SHA-256(0x00 || data)``; an inner node is
  ``SHA-256(0x01 || left || right)``, the left subtree holding the largest power of two
  of leaves smaller than their count (RFC 6962 section 2.1). The prefixes keep a leaf
  from passing for a node (second-preimage attacks);
- an inclusion proof of leaf ``i`` of ``n`` is its audit path, checked with RFC 9162's
  algorithm (section 2.1.3.2), which also rejects a path of the wrong length.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["inclusion_path", "leaf_hash", "node_hash", "root", "root_from_path"]


def leaf_hash(data: bytes) -> bytes:
    """The hash of a leaf holding ``data``."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an inner node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """The root of the tree over ``leaves`` (leaf hashes, in order)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    level = list(leaves)
    # Bottom-up pairing gives RFC 6962's tree: a lone last node moves up unchanged.
    while len(level) > 1:
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def inclusion_path(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """The audit path of leaf ``index`` (RFC 6962 ``PATH(m, D[n])``), leaf side first."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf {index} is not in a tree of {len(leaves)} leaves")
    path: list[bytes] = []
    lo, hi = 0, len(leaves)
    # top-down: collect the sibling subtree at each level, then reverse
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(root(leaves[lo + k : hi]))
            hi = lo + k
        else:
            path.append(root(leaves[lo : lo + k]))
            lo = lo + k
    return path[::-1]


def root_from_path(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes | None:
    """The root that ``path`` proves leaf ``leaf`` at ``index`` of ``size`` leaves under
    (RFC 9162 2.1.3.2), or None when the path cannot be one (wrong length, index out of
    range)."""
    if not 0 <= index < size:
        return None
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None
