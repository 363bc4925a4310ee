"""accord's transactional LangGraph checkpointer.

``AccordSaver`` (sync, ``pymongo.MongoClient``) and ``AsyncAccordSaver`` (native async,
``pymongo.AsyncMongoClient``) commit each step's state, short-term memory, business writes
and outbox events in one MongoDB transaction. See docs/checkpointer.md.
"""

from accord.checkpointers import business
from accord.checkpointers.aio import AsyncAccordSaver
from accord.checkpointers.saver import AccordSaver
from accord.checkpointers.schema import CollectionNames

__all__ = ["AccordSaver", "AsyncAccordSaver", "CollectionNames", "business"]
