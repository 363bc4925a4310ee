"""accord's transactional LangGraph checkpointer.

``AccordSaver`` (sync, ``pymongo.MongoClient``) and ``AsyncAccordSaver`` (native async,
``pymongo.AsyncMongoClient``) commit each step's state, short-term memory, business writes
and outbox events in one MongoDB transaction. ``AsyncAccordSaver`` is the source;
``AccordSaver`` is generated from it (``tools/synchro.py``). See docs/checkpointer.md.
"""

from accord.checkpointers import business
from accord.checkpointers.asynchronous.saver import AsyncAccordSaver
from accord.checkpointers.schema import CollectionNames
from accord.checkpointers.synchronous.saver import AccordSaver

__all__ = ["AccordSaver", "AsyncAccordSaver", "CollectionNames", "business"]
