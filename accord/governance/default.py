"""The built-in default policy, written in the policy file format.

It is what accord enforces when no policy file is given (``ACCORD_POLICY`` unset, no
``policy=`` argument), and what a policy file overrides class by class, field by field.
Keeping it as TOML text (not Python) means it is loaded by the same code as a user's file,
``accord governance show`` can print it as it is, and docs/governance.md quotes it.

Least privilege for accord's own parts, with the grants each one's real work needs:

* ``runtime`` (the checkpointer, business writes of nodes, the LangGraph store a graph
  uses, runs): execution state, messages, runs, business records, outbox events, and
  long-term memory (a node's ``store.put`` acts as the runtime);
* ``aggregator``: reads messages and outbox events, claims and completes events, writes
  long-term memory with its history and vectors;
* ``memory-api`` (HTTP API keys, MCP): long-term memory, its history and vectors, and
  nothing else: never checkpoints, pending writes, messages or the outbox (it reads the
  catalog);
* ``auditor``: finds audit records, and finds and writes digests of their chains
  (``accord audit digest``), nothing else;
* every role finds the applied policy and the legal holds: every process enforces them;
* ``admin`` (the CLI's operating-system user): everything but changing or removing audit
  records, which nobody may do (a policy that grants it is refused);
* encryption is off for every class (it needs ``ACCORD_MASTER_KEY``); every service role
  may find data keys (to decrypt what it reads); the admin also re-wraps them (a master
  key's rotation) and removes them (an erasure destroys them).
"""

from __future__ import annotations

SOURCE = "<built-in default policy>"

DEFAULT_POLICY_TOML = """\
# accord's default governance policy (accord governance show prints the effective one).
# Actions: find, insert, update, remove. Durations: seconds, or 30d, 12h, 2w, 1y.
version = 1

[classes.checkpoint]
collection = "accord_checkpoints"
audit = "metadata"
subject_fields = ["meta.user_id"]     # the run's config.user_id, as LangGraph copies it
retention = { keep_latest = 100, expire_after = "90d", after = "last_activity" }
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.checkpoint_blob]      # goes with its checkpoints
collection = "accord_checkpoint_blobs"
audit = "metadata"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.checkpoint_write]     # goes with its checkpoint
collection = "accord_checkpoint_writes"
audit = "metadata"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.checkpoint_head]      # goes with its checkpoints
collection = "checkpoint_heads"
audit = "off"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.short_term_memory]
collection = "short_term_memory"
audit = "metadata"
subject_fields = ["metadata.user_id"]
retention = { expire_after = "30d", after = "last_activity" }
roles = { runtime = ["find", "insert", "update", "remove"], aggregator = ["find"], admin = ["find", "insert", "update", "remove"] }

[classes.run]
collection = "runs"
audit = "off"
retention = { expire_after = "90d", after = "last_activity" }
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.outbox]
collection = "outbox"
audit = "off"
subject_fields = ["configurable.user_id"]
retention = { expire_after = "7d", after = "done" }
roles = { runtime = ["find", "insert", "update", "remove"], aggregator = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.long_term_memory]
collection = "long_term_memory"
audit = "full"
subject_fields = ["namespace"]
roles = { runtime = ["find", "insert", "update", "remove"], aggregator = ["find", "insert", "update", "remove"], memory-api = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.memory_history]
collection = "memory_history"
audit = "metadata"
subject_fields = ["namespace"]
roles = { runtime = ["find", "insert", "update", "remove"], aggregator = ["find", "insert", "update", "remove"], memory-api = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.memory_vector]        # goes with its memory
collection = "memory_vectors"
audit = "off"
subject_fields = ["namespace"]
roles = { runtime = ["find", "insert", "update", "remove"], aggregator = ["find", "insert", "update", "remove"], memory-api = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.business]             # every business collection without a [classes."business:NAME"]
audit = "metadata"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.workflow_event]       # shared workflow logs: appended in a step, numbered by accord
collection = "accord_workflow_events"
audit = "metadata"
subject_fields = ["event.user_id"]
roles = { runtime = ["find", "insert", "update"], admin = ["find", "insert", "update", "remove"] }

[classes.artifact]             # large outputs by pointer (GridFS files): go with their thread
collection = "accord_artifacts.files"
audit = "metadata"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.artifact_chunk]       # the bytes of artifacts: go with their artifact
collection = "accord_artifacts.chunks"
audit = "off"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.business_undo]        # before-images of business writes: go with their thread
collection = "accord_business_undo"
audit = "off"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.audit]                # append-only: nobody may update or remove a record
collection = "accord_audit"
audit = "off"
retention = { expire_after = "7y", after = "created" }
roles = { auditor = ["find"], admin = ["find"] }

[classes.audit_digest]         # digests of the audit chains: written once, never changed
collection = "accord_audit_digests"
audit = "off"
roles = { auditor = ["find", "insert"], admin = ["find", "insert"] }

[classes.catalog]              # which collections accord owns
collection = "accord_catalog"
audit = "off"
roles = { runtime = ["find", "insert", "update"], aggregator = ["find", "insert", "update"], memory-api = ["find"], admin = ["find", "insert", "update", "remove"] }

[classes.migration]            # progress of migrations from other savers
collection = "accord_migrations"
audit = "off"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.recorded_call]        # tool and model calls of runs, replayed after a crash
collection = "accord_recorded_calls"
audit = "metadata"
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.queued_run]           # the queue of runs: submitted, claimed by workers, waiting
collection = "accord_run_queue"
audit = "off"
retention = { expire_after = "30d", after = "done" }   # ended runs (done, failed, cancelled)
roles = { runtime = ["find", "insert", "update", "remove"], admin = ["find", "insert", "update", "remove"] }

[classes.policy]               # the policies applied to the database, every version kept
collection = "accord_policies"
audit = "metadata"
roles = { runtime = ["find"], aggregator = ["find"], memory-api = ["find"], auditor = ["find"], admin = ["find", "insert", "update"] }

[classes.encryption_key]       # data keys of encrypted classes (off by default): an erasure destroys them
collection = "accord_keys"
audit = "metadata"
roles = { runtime = ["find"], aggregator = ["find"], memory-api = ["find"], admin = ["find", "insert", "update", "remove"] }

[classes.hold]                 # legal holds: what must not expire, be swept or erased
collection = "accord_holds"
audit = "metadata"
roles = { runtime = ["find"], aggregator = ["find"], memory-api = ["find"], auditor = ["find"], admin = ["find", "insert", "update", "remove"] }
"""
