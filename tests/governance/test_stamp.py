"""``retention.stamp``: which ops get ``expire_at`` for each event, in process."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from accord.governance.loading import default_policy, parse_policy
from accord.governance.retention import TtlRule, held_op, stamp, thread_ttl, ttl_rule
from accord.platform.plan import Op, insert_once

NOW = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
AT = NOW + HOUR


def test_created_stamps_inserts_and_new_upserts_only() -> None:
    rule = TtlRule(HOUR, "created")
    assert stamp(Op("insert", doc={"a": 1}), rule, NOW).doc == {"a": 1, "expire_at": AT}
    once = stamp(insert_once({"_id": 1, "a": 1}), rule, NOW).doc
    assert once == {"$setOnInsert": {"a": 1, "expire_at": AT}}
    update = Op("update", {"_id": 1}, {"$set": {"a": 2}})
    assert stamp(update, rule, NOW) == update  # an existing document keeps its creation


def test_updated_stamps_every_write() -> None:
    rule = TtlRule(HOUR, "updated")
    assert stamp(Op("update", {"_id": 1}, {"$set": {"a": 2}}), rule, NOW).doc == {
        "$set": {"a": 2, "expire_at": AT}
    }
    pipeline = stamp(Op("update_many", {}, [{"$set": {"a": 1}}]), rule, NOW).doc
    assert pipeline == [{"$set": {"a": 1}}, {"$set": {"expire_at": AT}}]
    replaced = stamp(Op("replace", {"_id": 1}, {"a": 3}), rule, NOW).doc
    assert replaced == {"a": 3, "expire_at": AT}
    assert stamp(Op("delete", {"_id": 1}), rule, NOW) == Op("delete", {"_id": 1})


def test_done_stamps_when_marked_done_and_the_shorter_period_wins() -> None:
    rule = TtlRule(HOUR, "done")
    claim = Op("find_one_and_update", {"status": "pending"}, {"$set": {"status": "claimed"}})
    assert stamp(claim, rule, NOW) == claim
    done = stamp(Op("update", {"_id": 1}, {"$set": {"status": "done"}}), rule, NOW)
    assert done.doc == {"$set": {"status": "done", "expire_at": AT}}
    sooner = Op("update", {"_id": 1}, {"$set": {"status": "done", "expire_at": NOW}})
    assert stamp(sooner, rule, NOW) == sooner
    later = Op("update", {"_id": 1}, {"$set": {"status": "done", "expire_at": AT + HOUR}})
    assert stamp(later, rule, NOW).doc == {"$set": {"status": "done", "expire_at": AT}}


def test_an_op_that_moves_the_expiry_itself_is_left_alone() -> None:
    rule = TtlRule(HOUR, "updated")
    for doc in ({"$rename": {"expire_at": "held_expire_at"}}, {"$unset": {"expire_at": ""}},
                {"$set": {"expire_at": NOW}}):  # fmt: skip
        op = Op("update_many", {}, doc)
        assert stamp(op, rule, NOW) == op


def test_rules_from_the_policy() -> None:
    policy = default_policy()
    assert ttl_rule(policy, "outbox") == TtlRule(timedelta(days=7), "done")
    assert ttl_rule(policy, "checkpoint") is None  # threads go whole, by the sweep
    assert ttl_rule(policy, "long_term_memory") is None  # until erased
    assert thread_ttl(policy) == timedelta(days=30)  # the shortest of the thread's classes
    memories = parse_policy(
        '[classes.long_term_memory]\nretention = { expire_after = "2d" }\n', "m"
    )
    assert ttl_rule(memories, "memory_vector") == TtlRule(timedelta(days=2), "created")


def test_a_held_op_keeps_its_own_expiry_as_held() -> None:
    """An outbox event marked done during a hold set its consumer's expire_at itself,
    which the hook left in place: the TTL monitor deleted held events."""
    done = Op("update", {"_id": 1}, {"$set": {"status": "done", "expire_at": AT}})
    assert held_op(done).doc == {"$set": {"status": "done", "held_expire_at": AT}}
    assert held_op(Op("insert", doc={"a": 1, "expire_at": AT})).doc == {
        "a": 1, "held_expire_at": AT,
    }  # fmt: skip
    upsert = Op("update", {"_id": 1}, {"$setOnInsert": {"expire_at": AT}}, upsert=True)
    assert held_op(upsert).doc == {"$setOnInsert": {"held_expire_at": AT}}
    plain = Op("update", {"_id": 1}, {"$set": {"a": 2}})
    rename = Op("update_many", {}, {"$rename": {"expire_at": "held_expire_at"}})
    assert held_op(plain) == plain and held_op(rename) == rename
