"""AsyncAccordSaver: the transactional LangGraph checkpointer (its sync twin, AccordSaver, is
generated from this module).

Each ``put``/``put_writes`` is a plan (:mod:`accord.checkpointers.plans`) run by the
platform's kernel in one transaction, led by the run-registry guard
(:mod:`accord.checkpointers.ownership`); a run claims its thread when LangGraph's loop
loads it, and releases it when the loop exits. The saver keeps the state it last
committed per thread (:mod:`accord.checkpointers.cache`) and serves reads from it while
it is current. See docs/checkpointer.md.

The class is made of layers, one module each (:mod:`.saver_core`, :mod:`.saver_runs`,
:mod:`.saver_reads`, :mod:`.saver_queue`, :mod:`.saver_writes`,
:mod:`.saver_artifacts`, :mod:`.saver_maintenance`, :mod:`.saver_rollback`); this module adds what serves the other calling convention
(:mod:`accord.checkpointers.bridges`) and ``from_conn_string``.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver.py``
is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from pymongo import AsyncMongoClient

from accord.checkpointers import bridges
from accord.checkpointers.asynchronous.saver_rollback import AsyncSaverRollback
from accord.platform.connection import client_options

_IS_SYNC = False

# What differs between the twins (serving the other calling convention, locks) lives in
# accord.checkpointers.bridges, which is not generated.
_Bridge = bridges.AnswersAsyncCalls if _IS_SYNC else bridges.AnswersSyncCalls


class AsyncAccordSaver(_Bridge, AsyncSaverRollback):  # type: ignore[misc,valid-type]
    """The transactional LangGraph checkpointer on pymongo's ``AsyncMongoClient``.

    It answers LangGraph's sync and async methods alike: the ones of the other calling
    convention are served by :mod:`accord.checkpointers.bridges` (on the saver's event
    loop from other threads, or in worker threads). Each ``put`` and ``put_writes`` is
    one MongoDB transaction (write concern majority, retried on transient errors,
    bounded by ``timeout``). See :class:`~accord.checkpointers.base.AccordBase` for the
    keyword arguments and docs/checkpointer.md for the storage model, ownership and
    guarantees, and the README for examples.
    """

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        db_name: str = "accord",
        checkpoint_collection_name: str | None = None,
        writes_collection_name: str | None = None,
        ttl: int | float | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AsyncAccordSaver]:
        """Connect, run :meth:`setup`, yield the saver, close the client on exit. The
        arguments are MongoDBSaver.from_conn_string's, in its order, plus the saver's
        keywords."""
        client: AsyncMongoClient[Any] = AsyncMongoClient(
            conn_string, **client_options(conn_string, {})
        )  # (a typo'd host: ACCORD_SERVER_SELECTION_TIMEOUT, not 30 s)
        try:
            saver = cls(
                client,
                db_name,
                checkpoint_collection_name,
                writes_collection_name,
                ttl,
                **kwargs,
            )
            await saver.setup()
            yield saver
        finally:
            await client.close()
