"""The aggregator: long-term memory derived from committed steps, exactly once.

Every step the checkpointer commits writes an ``outbox`` event in the same transaction;
the aggregator claims each event with a lease, reads its messages, extracts, embeds and
consolidates memories, and commits them with the event's completion in one transaction
(the full account: :mod:`accord.memory.asynchronous.aggregator`).

This module gathers its two twins and what they share, for import:

- :class:`Aggregator` and :class:`BackgroundAggregator` (a daemon thread) on pymongo's
  ``MongoClient``: ``accord memory worker``, the demo, WSGI applications;
- :class:`AsyncAggregator` and :class:`AsyncBackgroundAggregator` (an asyncio task) on
  ``AsyncMongoClient``: the same work for applications that run an event loop.

The async ones are the source; the sync ones are generated from them by
``tools/synchro.py`` (:mod:`accord.memory.synchronous.aggregator`). Configuration,
outcomes, statistics and the plans that need no I/O are in
:mod:`accord.memory.aggregation`.
"""

from __future__ import annotations

from accord.memory.aggregation import (
    COMPONENT,
    CONSUMER_INDEXES,
    DEFAULT_NAMESPACES,
    AggregationStats,
    AggregatorConfig,
    Outcome,
    Stage,
    default_worker_id,
    label_value,
    percentile,
    requeue_plan,
)
from accord.memory.asynchronous.aggregator import AsyncAggregator
from accord.memory.asynchronous.background import AsyncBackgroundAggregator
from accord.memory.asynchronous.outbox_stats import (
    aggregation_stats as async_aggregation_stats,
)
from accord.memory.synchronous.aggregator import Aggregator
from accord.memory.synchronous.background import BackgroundAggregator
from accord.memory.synchronous.outbox_stats import aggregation_stats

__all__ = [
    "COMPONENT",
    "CONSUMER_INDEXES",
    "DEFAULT_NAMESPACES",
    "AggregationStats",
    "Aggregator",
    "AggregatorConfig",
    "AsyncAggregator",
    "AsyncBackgroundAggregator",
    "BackgroundAggregator",
    "Outcome",
    "Stage",
    "aggregation_stats",
    "async_aggregation_stats",
    "default_worker_id",
    "label_value",
    "percentile",
    "requeue_plan",
]
