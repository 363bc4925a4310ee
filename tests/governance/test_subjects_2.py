"""Data subjects, continued (docs/governance.md, "Data subjects"): identifiers stored in
another form than the one given on the command line.

The graph, the policy and the helpers are those of ``test_subjects.py`` (a business
record, a workflow event, a recorded call and an artifact per turn, each naming the
run's ``user_id``; the audit trail in ``full`` mode).
"""

from __future__ import annotations

import json
import struct
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from bson import json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from pymongo import MongoClient
from typer.testing import CliRunner

from accord import runtime
from accord.errors import SubjectHeld
from accord.governance.audit_records import RECORDS
from accord.governance.holding import place, release
from accord.governance.holds import Hold
from accord.governance.verify import verify_chain
from accord.platform.cli import app as cli
from accord.platform.context import Principal
from accord.runtime import Accord
from tests.governance.test_subjects import SECRET, Chat, _graph, _mentions, policy_file

__all__ = ["policy_file"]  # the fixture, imported for pytest


def _chat(client: MongoClient, db_name: str, user: object, thread: str, words: str) -> None:
    graph = _graph(Accord(client=client, db_name=db_name).checkpointer())
    config = {"configurable": {"thread_id": thread, "user_id": user}}
    graph.invoke({"messages": [HumanMessage(words, id=f"h-{thread}")]}, config)


def _intact_images(client: MongoClient, db_name: str, text: str) -> int:
    """Image entries holding ``text`` that were not erased (the records of a legal hold
    stay: the hold's ``_id`` names its subject; docs/governance.md)."""
    live = {"images": {"$exists": True}, "artifact": {"$ne": "hold"}}
    return sum(
        1 for r in client[db_name][RECORDS].find(live)
        for i in r["images"] if "erased" not in i and text in "".join(str(v) for v in i.values())
    )  # fmt: skip


def test_an_integer_user_id_is_exported_and_erased_by_its_decimal_identifier(
    client: MongoClient, mongo_uri: str, db_name: str, policy_file: Path, tmp_path: Path
) -> None:
    """An application whose ``user_id`` is an ``int``: the command line gives the text
    ``4242``, which matched nothing (the erasure reported 0 threads, success, and every
    document stayed)."""
    _chat(client, db_name, 4242, "chat-int", f"I live in {SECRET}")
    _chat(client, db_name, 424, "chat-other", "I live in Oslo")
    assert _intact_images(client, db_name, '"user_id":4242') > 0
    out = tmp_path / "export"
    exported = CliRunner().invoke(cli, ["governance", "export-subject", "4242", "--out", str(out),
                                        "--db", db_name, "--uri", mongo_uri])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["threads"] == [{"tenant_id": "default", "thread_id": "chat-int"}]
    orders = (out / "business-orders.jsonl").read_text().splitlines()
    assert [json_util.loads(o)["user_id"] for o in orders] == [4242]

    erased = CliRunner().invoke(
        cli, ["governance", "erase", "4242", "--yes", "--db", db_name, "--uri", mongo_uri]
    )
    assert erased.exit_code == 0, erased.output
    assert "erased 1 thread(s)" in erased.output
    assert _mentions(client, db_name, SECRET) == {}
    assert _intact_images(client, db_name, '"user_id":4242') == 0
    db = client[db_name]
    assert db.orders.count_documents({"user_id": 4242}) == 0
    assert db.accord_workflow_events.count_documents({"event.user_id": 4242}) == 0
    # the other user's data and images, whose number holds the same digits, stay
    assert db.accord_checkpoints.count_documents({"thread_id": "chat-other"}) > 0
    assert db.orders.count_documents({"user_id": 424}) == 1
    assert _intact_images(client, db_name, '"user_id":424') > 0
    # no document holds the subject's number as stored (a BSON int32 named user_id)
    stored = b"\x10user_id\x00" + struct.pack("<i", 4242)
    raw = client.get_database(db_name, codec_options=CodecOptions(document_class=RawBSONDocument))
    assert not [n for n in raw.list_collection_names() for d in raw[n].find() if stored in d.raw]
    assert verify_chain(runtime.kernel(client), db_name).ok


@pytest.mark.parametrize("not_a_number", ["04242", "+4242", "-0", "4242.0", "99999999999999999999"])
def test_only_a_canonical_decimal_identifier_names_an_integer(
    client: MongoClient, db_name: str, policy_file: Path, not_a_number: str
) -> None:
    _chat(client, db_name, 4242, "chat-int", f"I live in {SECRET}")
    report = runtime.erase_subject_data(client, not_a_number, db_name, compact=False)
    assert report.threads == 0 and not any(report.deleted.values())


def test_an_identifier_is_found_in_either_unicode_normalization_form(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """``josé`` typed with one code point (NFC, as most keyboards do) and stored with two
    (NFD, as macOS file names and some clients do) is one identifier: the erasure found
    nothing. A hold on either form covers the other."""
    nfc = "jos\u00e9"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    _chat(client, db_name, nfd, "chat-nfd", f"I live in {SECRET}")
    _chat(client, db_name, "jose", "chat-plain", "I live in Oslo")
    admin = runtime.kernel(client, principal=Principal.os_user())
    policy = runtime.effective_policy(admin, db_name)
    place(admin, db_name, Hold("subject", nfd, reason="case 9"), policy)
    with pytest.raises(SubjectHeld, match="case 9"):
        runtime.erase_subject_data(client, nfc, db_name, compact=False)
    assert _mentions(client, db_name, SECRET)
    release(admin, db_name, Hold("subject", nfd), policy)
    report = runtime.erase_subject_data(client, nfc, db_name, compact=False)
    assert report.threads == 1
    assert _mentions(client, db_name, SECRET) == {}
    assert _intact_images(client, db_name, nfd) == 0
    assert client[db_name].accord_checkpoints.count_documents({"thread_id": "chat-plain"}) > 0


def _reply_graph(saver: Any) -> Any:
    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("Noted.", id=f"ai-{len(state['messages'])}")]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver)


def test_a_tenant_scoped_erasure_keeps_another_tenants_cross_tenant_records(
    client: MongoClient, db_name: str, policy_file: Path
) -> None:
    """The aggregator's claims of outbox events are recorded under tenant ``*``; erasing
    ``u-7`` in ``acme`` erased the images of ``beta``'s claims of its own ``u-7``'s
    events too (evidence of another tenant), and must erase only ``acme``'s."""
    root = Accord(client=client, db_name=db_name)
    graph = _reply_graph(root.checkpointer())
    with root.background_aggregator() as worker:
        for tenant in ("acme", "beta"):
            config = {"configurable": {"thread_id": f"chat-{tenant}", "user_id": "u-7",
                                       "tenant_id": tenant}}  # fmt: skip
            graph.invoke({"messages": [HumanMessage(f"{tenant} {SECRET}", id="h1")]}, config)
        assert worker.wait_idle(timeout=60)

    def claims(tenant: str) -> int:
        """``*`` records' image entries, not erased, naming the subject and ``tenant``."""
        return sum(
            1 for r in client[db_name][RECORDS].find({"tenant_id": "*", "images": {"$exists": True}})
            for i in r["images"] if "erased" not in i
            and '"u-7"' in (text := "".join(map(str, i.values())))
            and f'"tenant_id":"{tenant}"' in text
        )  # fmt: skip

    assert claims("acme") > 0 and claims("beta") > 0
    beta = claims("beta")
    runtime.erase_subject_data(client, "u-7", db_name, tenant_id="acme", compact=False)
    assert claims("acme") == 0 and claims("beta") == beta
    assert _mentions(client, db_name, f"acme {SECRET}") == {}
    assert _mentions(client, db_name, f"beta {SECRET}")
    assert verify_chain(runtime.kernel(client), db_name).ok


def test_a_huge_identifier_is_refused_with_a_short_message(mongo_uri: str, db_name: str) -> None:
    """The error quoted the whole identifier (a megabyte pasted by mistake was echoed
    back), and a tenant of any length was accepted (no tenant has more than 1,024)."""
    for args in (["erase", "x" * 100_000, "--yes"],
                 ["erase", "u-7", "--tenant", "t" * 100_000, "--yes"],
                 ["export-subject", "$" + "x" * 100_000, "--out", "unused"]):  # fmt: skip
        result = CliRunner().invoke(cli, ["governance", *args, "--db", db_name, "--uri", mongo_uri])
        assert result.exit_code == 2, result.output[:300]
        assert "characters)" in result.output and len(result.output) < 500, result.output[:300]


def test_classes_whose_names_make_one_file_name_are_exported_apart(
    client: MongoClient, db_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``business:a b`` and ``business:a-b`` make the same safe file name (and
    ``business:A-b`` does on a case-insensitive file system): the second class's file
    overwrote the first's, so its records were missing from the export."""
    names = ("a b", "a-b", "A-b")
    path = tmp_path / "policy.toml"
    path.write_text("".join(
        f'[classes."business:{n}"]\nsubject_fields = ["user_id"]\n'
        'roles = { runtime = ["find", "insert"], admin = ["find", "insert"] }\n'
        for n in names
    ))  # fmt: skip
    monkeypatch.setenv("ACCORD_POLICY", str(path))
    Accord(client=client, db_name=db_name).checkpointer()  # applies the policy
    for n in names:
        client[db_name][n].insert_one({"_id": n, "tenant_id": "default", "user_id": "u-9"})
    out = tmp_path / "export"
    manifest = runtime.export_subject_data(client, "u-9", out, db_name)
    by_class = {f["class"]: (name, f["documents"]) for name, f in manifest["files"].items()}
    assert {c: d for c, (_, d) in by_class.items() if c.startswith("business:")} == {
        f"business:{n}": 1 for n in names
    }
    files = {name.lower() for name, _ in by_class.values()}
    assert len(files) == len(by_class)  # distinct, whatever the file system's case
    for n in names:
        (line,) = (out / by_class[f"business:{n}"][0]).read_text().splitlines()
        assert json_util.loads(line)["_id"] == n
