"""Checkpoint schema migrations: registered functions that upgrade stored documents of an
older layout when they are loaded.

Every document the checkpointer stores has a layout version, ``schema``; a document
without the field is version 1 (the layout every accord so far writes). When a release
changes a layout it raises :data:`CURRENT_SCHEMA`, writes the new number, and registers
one function per changed class that turns a document of the previous version into the
next::

    from accord.checkpointers.schema_migrations import MIGRATIONS

    @MIGRATIONS.register("checkpoint", 1)          # version 1 -> 2
    def body_field_renamed(doc):
        doc["body"] = doc.pop("checkpoint")
        return doc

Reads (:class:`accord.checkpointers.reads.ReadBatch`, under ``get_tuple`` and ``list``)
pass every checkpoint, blob, pending-write and message document through
:meth:`SchemaMigrations.upgrade` before using it: an old thread is readable at once,
without a bulk rewrite; its next checkpoints are written in the current layout. Nothing
is rewritten in place (the old documents stay as they were, so a rollback of the release
still reads them). A class with no function for a version did not change in it. A
document of a version no function starts from, or newer than this code, is refused with a
:class:`~accord.errors.ForeignDataError` naming it, never half-read.

The registry is the process's (:data:`MIGRATIONS`), like the layout itself: accord's
releases register their migrations at import, and a test may register its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from accord.errors import ForeignDataError

#: The layout version this code writes (documents without ``schema`` are version 1).
CURRENT_SCHEMA = 1
#: The field of a stored document that holds its layout version.
SCHEMA_FIELD = "schema"
#: The classes of documents reads upgrade.
KINDS = ("checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory")

Upgrade = Callable[[dict[str, Any]], Mapping[str, Any]]


class SchemaMigrations:
    """Upgrades of stored documents, per class and from-version (module docstring)."""

    def __init__(self, current: int = CURRENT_SCHEMA) -> None:
        self.current = current
        self._steps: dict[tuple[str, int], Upgrade] = {}
        self._mutex = threading.Lock()

    def register(self, kind: str, from_version: int) -> Callable[[Upgrade], Upgrade]:
        """Register the upgrade of ``kind`` documents from ``from_version`` to the next."""
        if kind not in KINDS:
            raise ValueError(f"unknown document class {kind!r}; one of {KINDS}")

        def add(fn: Upgrade) -> Upgrade:
            with self._mutex:
                self._steps[(kind, from_version)] = fn
            return fn

        return add

    def remove(self, kind: str, from_version: int) -> None:
        with self._mutex:
            self._steps.pop((kind, from_version), None)

    @contextmanager
    def registered(self, kind: str, from_version: int, fn: Upgrade) -> Iterator[None]:
        """``fn`` registered for the duration of a ``with`` block."""
        self.register(kind, from_version)(fn)
        try:
            yield
        finally:
            self.remove(kind, from_version)

    def upgrade(self, kind: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """``doc`` in the current layout (itself when it is in it already)."""
        version = doc.get(SCHEMA_FIELD, 1)
        if version == self.current:
            return doc
        where = f"{kind} document {doc.get('_id')!r} (thread {doc.get('thread_id')!r})"
        if not isinstance(version, int) or isinstance(version, bool) or version > self.current:
            raise ForeignDataError(
                f"{where} has layout version {version!r}, newer than this accord reads "
                f"(up to {self.current}): it was written by a newer release. Upgrade accord "
                f"on this machine; nothing was read."
            )
        out = dict(doc)
        with self._mutex:
            steps = dict(self._steps)
        while version < self.current:
            fn = steps.get((kind, version))
            if fn is None and not any(v == version for _, v in steps):
                raise ForeignDataError(
                    f"{where} has layout version {version}, and no migration from version "
                    f"{version} is registered (this accord writes version {self.current}). "
                    f"Register one (accord.checkpointers.schema_migrations.MIGRATIONS) or "
                    f"read it with the release that wrote it; nothing was read."
                )
            if fn is not None:
                out = dict(fn(out))
            version += 1
        out[SCHEMA_FIELD] = self.current
        return out

    def upgrade_all(self, kind: str, docs: list[Any]) -> list[Any]:
        """:meth:`upgrade` of each of ``docs`` (the same list when none needs it)."""
        if all(d.get(SCHEMA_FIELD, 1) == self.current for d in docs):
            return docs
        return [self.upgrade(kind, d) for d in docs]


#: The process's registry, applied by every read of the checkpointer.
MIGRATIONS = SchemaMigrations()
