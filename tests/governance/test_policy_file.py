"""The policy file: what it accepts, what it refuses, and that every refusal names the file
and the line (issue 23, "Bad policy files").

Each bad file below is written with the faulty line somewhere after comments and other
settings, so a message that named the first line, the table's line by accident, or no line
at all would fail. The expected line is the line of the key at fault.
"""

from __future__ import annotations

import os
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from accord.errors import ConfigurationError, PolicyError
from accord.governance.default import DEFAULT_POLICY_TOML
from accord.governance.loading import (
    POLICY_ENV,
    default_policy,
    load_policy,
    parse_policy,
    resolve_policy,
)
from accord.governance.policy import parse_duration
from accord.governance.toml_lines import key_lines, line_of

HEAD = "# a team's policy\nversion = 1\n\n"  # two lines before every case's own text

#: (id, text after HEAD, line of the problem (counting HEAD's 3 lines), words the message has)
BAD: list[tuple[str, str, int, str]] = [
    ("toml syntax", "[classes.checkpoint\naudit = 'off'\n", 4, "not valid TOML"),
    ("unknown top-level key", "custom_roles = []\nretention_days = 30\n", 5,
     "retention_days: unknown key"),
    ("unknown class", "[classes.checkpoint]\naudit = 'off'\n\n[classes.chekpoint]\n"
     "audit = 'off'\n", 7, "unknown artifact class 'chekpoint'"),
    ("unknown key in a class", "[classes.short_term_memory]\naudit = 'off'\nttl = 30\n", 6,
     "short_term_memory.ttl: unknown key"),
    ("unknown key in retention", "[classes.checkpoint.retention]\nexpire_after = '3d'\n"
     "keep = 5\n", 6, "retention.keep: unknown key"),
    ("negative duration string", "[classes.short_term_memory]\naudit = 'off'\n"
     "retention = { expire_after = '-3d', after = 'last_activity' }\n", 6,
     "negative duration '-3d'"),
    ("negative duration in seconds", "[classes.outbox.retention]\nafter = 'done'\n"
     "expire_after = -60\n", 6, "negative duration -60"),
    ("malformed duration", "[classes.outbox.retention]\nexpire_after = '3 fortnights'\n", 5,
     "'3 fortnights' is not a duration"),
    ("unknown action (multi-line array)", "[classes.checkpoint.roles]\nruntime = [\n"
     "  'find',\n  'delete',\n]\n", 7, "got 'delete'"),
    ("unknown role", "[classes.checkpoint.roles]\nruntime = ['find']\nruntme = ['insert']\n", 6,
     "unknown role 'runtme'"),
    ("update granted on audit", "[classes.audit]\naudit = 'off'\n"
     "roles = { auditor = ['find'], runtime = ['insert', 'update'] }\n", 6,
     "grants update on audit records to 'runtime'"),
    ("remove granted on audit to a principal", "[classes.audit.principals]\n"
     "'user:ops' = ['find']\n\"user:mallory\" = ['remove']\n", 6,
     "grants remove on audit records to 'user:mallory'"),
    ("update granted on audit to admin", "[classes.audit.roles]\nauditor = ['find']\n"
     "admin = ['find', 'update', 'remove']\n", 6, "grants update and remove on audit"),
    ("keep_latest on a class without versions", "[classes.short_term_memory.retention]\n"
     "expire_after = '30d'\nkeep_latest = 5\n", 6, "only the checkpoint class"),
    ("keep_latest of zero", "[classes.checkpoint.retention]\nkeep_latest = 0\n", 5,
     "greater than 0"),
    ("a blob expiring on its own", "[classes.checkpoint_blob]\naudit = 'off'\n"
     "retention = { expire_after = '1d' }\n", 6, "cannot expire on its own"),
    ("vectors expiring on their own", "[classes.memory_vector.retention]\n"
     "expire_after = '1d'\n", 4, "goes with its long_term_memory documents"),
    ("after without expire_after", "[classes.long_term_memory.retention]\n\nafter = 'created'\n",
     6, "there is no expire_after"),
    ("done on a class without events", "[classes.checkpoint.retention]\nexpire_after = '1d'\n"
     "after = 'done'\n", 6, "only outbox events and queued runs are 'done'"),
    ("last_activity on a class without threads", "[classes.long_term_memory]\n"
     "retention = { expire_after = '1d', after = 'last_activity' }\n", 5, "belong to no thread"),
    ("two classes in one collection", "[classes.long_term_memory]\naudit = 'full'\n"
     "[classes.memory_history]\ncollection = 'long_term_memory'\n", 7,
     "is the collection of class 'long_term_memory'"),
    ("a business class naming another collection", "[classes.\"business:orders\"]\n"
     "audit = 'full'\ncollection = 'invoices'\n", 6, "cannot name 'invoices'"),
    ("unknown audit mode", "[classes.checkpoint]\n\naudit = 'everything'\n", 6,
     "'off', 'metadata' or 'full'"),
    ("a subject field with an operator", "[classes.checkpoint]\n"
     "subject_fields = ['metadata.user_id', 'user.$id']\n", 5, "'user.$id' is not a field path"),
    ("a custom role that is a service role", "custom_roles = ['analyst', 'runtime']\n", 4,
     "'runtime' is a service role already"),
    ("a system collection", "[classes.run]\ncollection = 'system.users'\n", 5,
     "system.* collections"),
    ("roles that are not a table", "[classes.checkpoint]\nroles = ['runtime']\n", 5,
     "valid dictionary"),
    ("version zero", "custom_roles = []\n", 2, "greater than or equal to 1"),  # HEAD's line
    # accord's own collections that no class has by default: a class taking one would get
    # its roles and TTL index there (apply), over the audit chain or the hold fences
    ("a class taking the audit heads", "[classes.long_term_memory]\n"
     "collection = 'accord_audit_heads'\n", 5, "'accord_audit_heads' is accord's own"),
    ("a class taking the hold fences", "[classes.checkpoint]\naudit = 'off'\n"
     "collection = 'accord_hold_fences'\n", 6, "'accord_hold_fences' is accord's own"),
    ("a business class on an accord_ collection", "[classes.\"business:accord_audit_cuts\"]\n"
     "audit = 'full'\n", 4, "names starting with 'accord_' are accord's own"),
    ("a collection MongoDB refuses", "[classes.run]\ncollection = '.runs'\n", 5,
     "not starting or ending with '.'"),
    # accord's own classes (2026-12-07): a TTL lifted holds, shredded keys, reverted the
    # policy; a moved collection lost the holds from sight; their audit could be off
    ("holds that expire", "[classes.hold.retention]\nexpire_after = '1s'\n", 4,
     "hold takes no retention"),
    ("keys that expire", "[classes.encryption_key.retention]\nexpire_after = '1d'\n", 4,
     "a data key lasts until"),
    ("a policy that expires", "[classes.policy]\nretention = { expire_after = '1d' }\n", 5,
     "policy takes no retention"),
    ("artifacts expiring apart from their thread", "[classes.artifact.retention]\n"
     "expire_after = '1d'\n", 4, "artifact goes with its thread"),
    ("holds moved to another collection", "[classes.hold]\ncollection = 'accord_holds_v2'\n",
     5, "its collection is 'accord_holds'"),
    ("the audit of holds off", "[classes.hold]\naudit = 'off'\n", 5, "cannot be off"),
    ("keys audited with their images", "[classes.encryption_key]\naudit = 'full'\n", 5,
     "hashes only"),
    ("update granted on digests", "[classes.audit_digest.roles]\nauditor = ['find', 'update']\n",
     5, "grants update on audit_digest records"),
    ("a period past 100 years", "[classes.outbox.retention]\nafter = 'done'\n"
     "expire_after = '10000y'\n", 6, "too long"),
    ("a period of zero", "[classes.outbox.retention]\nafter = 'done'\nexpire_after = 0\n", 6,
     "must be more than 0"),
    ("keep_latest = true", "[classes.checkpoint.retention]\nkeep_latest = true\n", 5,
     "valid integer"),
    ("a business class named after a system collection", "[classes.\"business:system.users\"]\n"
     "audit = 'full'\n", 4, "system.* collections"),
    ("a subject found by tenant", "[classes.long_term_memory]\nsubject_fields = ['tenant_id']\n",
     5, "cannot name a data subject"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_file_is_refused_naming_the_file_and_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    version_zero = words.startswith("greater than or equal")  # the case "version zero"
    head = HEAD.replace("version = 1", "version = 0") if version_zero else HEAD
    path = tmp_path / "policy.toml"
    path.write_text(head + text)
    with pytest.raises(PolicyError) as refused:
        load_policy(path)
    message = str(refused.value)
    assert f"{path}:{line}: " in message, message
    assert words in message, message
    assert [p[1] for p in refused.value.problems] == [line], refused.value.problems
    assert isinstance(refused.value, ConfigurationError)


def test_there_are_at_least_15_bad_file_cases() -> None:
    assert len(BAD) >= 15


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = textwrap.dedent(
        """\
        [classes.checkpoint.roles]
        runtme = ["find"]

        [classes.audit.roles]
        runtime = ["remove"]
        """
    )
    with pytest.raises(PolicyError) as refused:
        parse_policy(text, "team.toml")
    assert [(p[0], p[1]) for p in refused.value.problems] == [("team.toml", 2), ("team.toml", 5)]
    assert "2 problems" in str(refused.value)


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(PolicyError, match=r"nope\.toml cannot be read"):
        load_policy(missing)


def test_the_default_policy_is_what_the_docs_promise() -> None:
    policy = default_policy()
    table = dict(policy.table())
    assert set(table) == {
        "checkpoint", "checkpoint_blob", "checkpoint_write", "checkpoint_head",
        "short_term_memory", "run", "outbox", "long_term_memory", "memory_history",
        "memory_vector", "business", "audit", "audit_digest", "catalog", "migration", "policy",
        "workflow_event", "recorded_call", "hold", "queued_run", "artifact", "artifact_chunk",
        "business_undo", "encryption_key",
    }  # fmt: skip
    for cls in ("checkpoint", "checkpoint_blob", "checkpoint_write", "short_term_memory",
                "run", "outbox", "business", "workflow_event", "recorded_call", "queued_run",
                "artifact", "artifact_chunk", "business_undo"):  # fmt: skip
        assert table[cls]["memory-api"] == "-", cls  # the memory API never sees state
        assert table[cls]["auditor"] == "-", cls
    assert {c for c, row in table.items() if row["auditor"] != "-"} == {
        "audit", "audit_digest", "policy", "hold",  # every process reads the last two
    }  # fmt: skip
    assert table["policy"]["auditor"] == table["hold"]["auditor"] == "f"
    assert table["audit_digest"]["auditor"] == "fi"  # digests are appended, never changed
    assert table["audit"] == {"runtime": "-", "aggregator": "-", "memory-api": "-",
                              "auditor": "f", "admin": "f"}  # fmt: skip
    assert table["long_term_memory"]["memory-api"] == "fiur"
    assert table["workflow_event"]["runtime"] == "fiu"  # appended, numbered, never removed
    assert table["short_term_memory"]["aggregator"] == "f"
    assert policy.classes["checkpoint"].retention.keep_latest == 100
    assert policy.classes["short_term_memory"].retention.expire_after == timedelta(days=30)
    assert policy.classes["audit"].retention.expire_after == timedelta(days=7 * 365)
    assert policy.source == "<built-in default policy>"
    # the default text is a policy file like any other (it names every class itself)
    assert parse_policy(DEFAULT_POLICY_TOML, "copy.toml", base=None).classes == policy.classes


def test_a_file_overrides_the_default_field_by_field() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            custom_roles = ["analyst"]

            [classes.checkpoint]
            roles = { runtime = ["find", "insert", "update"], analyst = ["find"] }

            [classes."business:orders"]
            roles = { runtime = ["find", "insert"], analyst = ["find"] }
            retention = { expire_after = "400d", after = "created" }
            """
        ),
        "team.toml",
    )
    checkpoint = policy.classes["checkpoint"]
    assert checkpoint.roles == {"runtime": {"find", "insert", "update"}, "analyst": {"find"}}
    assert checkpoint.retention == default_policy().classes["checkpoint"].retention  # kept
    orders = policy.of("business", "orders")
    assert orders is not None and orders.collection == "orders"
    assert orders.retention.expire_after == timedelta(days=400)
    assert orders.audit == "metadata"  # the business default's
    assert policy.of("business", "invoices") == policy.classes["business"]
    assert policy.classes["outbox"] == default_policy().classes["outbox"]
    assert policy.roles()[-1] == "analyst"


def test_retention_none_means_kept_until_erased() -> None:
    policy = parse_policy('[classes.short_term_memory]\nretention = "none"\n', "p.toml")
    assert policy.classes["short_term_memory"].retention.describe() == "until erased"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(60, 60), ("45s", 45), ("90m", 5400), ("1.5h", 5400), ("30d", 30 * 86400),
     ("2w", 14 * 86400), ("1y", 365 * 86400), ("100y", 100 * 365 * 86400)],
)  # fmt: skip
def test_durations(given: object, seconds: int) -> None:
    assert parse_duration(given) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "given",  # zero (expired as written), past 100 years (stamping overflowed), not finite
    [-1, "-1s", "10 parsecs", True, "d", [3], 0, "0d", "101y", "10000y", 1e300,
     float("inf"), float("nan")],
)  # fmt: skip
def test_bad_durations(given: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(given)


def test_resolve_takes_the_argument_then_the_environment_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert resolve_policy() is default_policy()
    path = tmp_path / "p.toml"
    path.write_text('[classes.checkpoint]\naudit = "full"\n')
    monkeypatch.setenv(POLICY_ENV, str(path))
    first = resolve_policy()
    assert first.classes["checkpoint"].audit == "full" and first.source == str(path.resolve())
    assert resolve_policy() is first  # unchanged file: not parsed again
    path.write_text('[classes.checkpoint]\naudit = "off"\n\n')  # changed (size and mtime)
    os.utime(path, ns=(1, 1))
    assert resolve_policy().classes["checkpoint"].audit == "off"
    other = tmp_path / "q.toml"
    other.write_text('[classes.checkpoint]\naudit = "metadata"\n')
    assert resolve_policy(other).classes["checkpoint"].audit == "metadata"
    assert resolve_policy(default_policy()) is default_policy()
    path.write_text("[classes.checkpoint]\naudit = 'off'\nbogus = 1\n")
    with pytest.raises(PolicyError, match=r"p\.toml:3: "):
        resolve_policy()


def test_key_lines_of_every_toml_shape() -> None:
    text = textwrap.dedent(
        '''\
        # comment with = and [brackets]
        version = 1
        [classes.checkpoint]
        collection = "x # not a comment" # a comment
        roles = { runtime = ["find",
           "insert"], admin = [] }
        [classes."business:orders".retention]
        expire_after = "3d"
        [[items]]
        name = "a"
        [[items]]
        name = "b"
        [items.extra]
        text = """multi
        [not.a.table]
        """
        a.b.c = true
        '''
    )
    lines = key_lines(text)
    assert lines[("version",)] == 2
    assert lines[("classes", "checkpoint", "collection")] == 4
    assert lines[("classes", "checkpoint", "roles", "runtime", 1)] == 6
    assert lines[("classes", "checkpoint", "roles", "admin")] == 6
    assert lines[("classes", "business:orders", "retention", "expire_after")] == 8
    assert lines[("items", 1, "name")] == 12
    assert lines[("items", 1, "extra", "a", "b", "c")] == 17
    assert ("not", "a", "table") not in lines
    assert line_of(lines, ("classes", "checkpoint", "retention", "keep")) == 3  # the table's
    assert line_of(lines, ("nothing",)) is None


def test_the_docs_table_is_the_default_policy() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "governance.md").read_text()
    block = page.split("<!-- roles-by-classes -->")[1].split("<!-- /roles-by-classes -->")[0]
    rows = [line for line in block.strip().splitlines()[2:]]
    policy = default_policy()
    expected = [
        f"| `{name}` | " + " | ".join(row[r] for r in policy.roles()) + " |"
        for name, row in policy.table()
    ]
    assert rows == expected


def test_a_refusal_survives_pickling() -> None:
    """A worker process's refusal reaches its parent whole (message and problems)."""
    import pickle

    with pytest.raises(PolicyError) as refused:
        parse_policy("[classes.audit.roles]\nadmin = ['remove']\n", "p.toml")
    again = pickle.loads(pickle.dumps(refused.value))
    assert str(again) == str(refused.value) and again.problems == refused.value.problems
