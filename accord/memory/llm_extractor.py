"""An extractor that asks a chat model: Mem0's two-call pattern on any LangChain chat model.

1. *Facts*: the model reads the step's new messages and lists the facts and preferences
   worth remembering about the user (JSON ``{"facts": [{"text", "kind"}]}``).
2. *Decisions*: for those facts the aggregator's :class:`~accord.memory.extraction.Recall`
   finds the most similar existing memories of the tenant; the model sees them (under
   short temporary ids, so it cannot invent real ones) next to the new facts and decides,
   per memory, ``ADD``, ``UPDATE`` (new text for an existing id), ``DELETE`` or ``NONE``
   (JSON ``{"memory": [{"id", "text", "event", "kind"}]}``).

The decisions become :class:`~accord.memory.extraction.Change` s; everything else
(embedding, near-duplicate merging, history, the transaction) is the aggregator's. A reply
that is not the JSON asked for raises :class:`~accord.errors.ExtractionError` (the
aggregator retries the event with backoff, then dead-letters it), and so does a decision
naming an id that was not offered. The model is called outside any transaction.

Any object with LangChain's ``invoke(messages)`` works (``BaseChatModel`` and
``Runnable`` s); tests use a deterministic fake chat model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from accord.errors import ConfigurationError, ExtractionError
from accord.memory.extraction import (
    FACT,
    PREFERENCE,
    Change,
    Conversation,
    Existing,
    Recall,
    episode_change,
)

FACTS_PROMPT = """You extract long-term memories about the user from a conversation.
List the facts about the user (name, location, work, relationships, plans, constraints)
and their preferences (likes, dislikes, habits) that would still be useful in a later,
unrelated conversation. Write each as one short sentence about "User". Ignore small talk,
questions, and what the assistant said about itself. Never invent anything.

Reply with JSON only, exactly this shape:
{"facts": [{"text": "User prefers window seats", "kind": "preference"}]}
kind is "fact" or "preference". Reply {"facts": []} when there is nothing to remember."""

DECIDE_PROMPT = """You maintain a user's long-term memories. You get the existing memories
most similar to some new facts, each with an id, and the new facts. For each new fact
decide:
- ADD: it is new information; give its text and kind.
- UPDATE: it refines or changes an existing memory; give that memory's id and the new,
  complete text (keep the information of both when they do not contradict each other).
- DELETE: it contradicts or retracts an existing memory; give that memory's id.
- NONE: it is already known.

Reply with JSON only, exactly this shape:
{"memory": [{"id": "0", "event": "UPDATE", "text": "...", "kind": "preference"},
            {"event": "ADD", "text": "...", "kind": "fact"},
            {"id": "1", "event": "DELETE"}]}
Only use ids from the existing memories. Leave out memories that do not change."""

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
KINDS = (FACT, PREFERENCE)


class LLMExtractor:
    """Extract with a chat model (see the module docstring).

    Args:
        model: a LangChain chat model (anything with ``invoke(messages)``).
        similar: existing memories recalled per new fact (Mem0 uses 5).
        episodes: also keep the deterministic per-thread episodic summary.
        facts_prompt, decide_prompt: override the system prompts.
    """

    name = "llm"

    def __init__(
        self,
        model: Any,
        *,
        similar: int = 5,
        episodes: bool = False,
        facts_prompt: str = FACTS_PROMPT,
        decide_prompt: str = DECIDE_PROMPT,
    ) -> None:
        if not hasattr(model, "invoke"):
            raise ConfigurationError(
                f"LLMExtractor needs a LangChain chat model (with invoke), got "
                f"{type(model).__name__}"
            )
        if not isinstance(similar, int) or isinstance(similar, bool) or not 1 <= similar <= 50:
            raise ConfigurationError(f"similar is an integer in [1, 50], got {similar!r}")
        self.model = model
        self.similar = similar
        self.episodes = episodes
        self.facts_prompt = facts_prompt
        self.decide_prompt = decide_prompt

    def extract(self, conversation: Conversation, recall: Recall) -> list[Change]:
        changes: list[Change] = []
        readable = [t for t in conversation.turns if t.text and t.text.strip()]
        user_ids = tuple(t.message_id for t in readable if t.from_user)
        if user_ids:
            transcript = "\n".join(f"{t.role}: {t.text}" for t in readable)
            facts = self._facts(transcript)
            if facts:
                changes += self._decide(facts, recall, user_ids)
        if self.episodes:
            episode = episode_change(conversation)
            if episode is not None:
                changes.append(episode)
        return changes

    def _facts(self, transcript: str) -> list[tuple[str, str]]:
        reply = self._ask(self.facts_prompt, transcript)
        items = _field(reply, "facts")
        facts = []
        for item in items:
            text, kind = _text_kind(item, "facts")
            facts.append((text, kind))
        return facts

    def _decide(
        self, facts: list[tuple[str, str]], recall: Recall, message_ids: tuple[str, ...]
    ) -> list[Change]:
        offered: dict[tuple[tuple[str, ...], str], Existing] = {}
        for text, _ in facts:
            for hit in recall(text, limit=self.similar):
                offered.setdefault((hit.namespace, hit.key), hit)
        existing = list(offered.values())
        payload = {
            "existing": [
                {"id": str(i), "text": e.text or "", "kind": e.kind} for i, e in enumerate(existing)
            ],
            "new_facts": [{"text": t, "kind": k} for t, k in facts],
        }
        reply = self._ask(self.decide_prompt, json.dumps(payload, ensure_ascii=False))
        changes = []
        for item in _field(reply, "memory"):
            if not isinstance(item, dict):
                raise ExtractionError(f"the model's decision {item!r} is not an object")
            event = str(item.get("event", "")).upper()
            if event == "NONE":
                continue
            if event == "ADD":
                text, kind = _text_kind(item, "memory")
                changes.append(Change("add", text, kind, message_ids=message_ids))
                continue
            if event not in ("UPDATE", "DELETE"):
                raise ExtractionError(
                    f"the model decided {event!r}; only ADD, UPDATE, DELETE or NONE are valid"
                )
            target = _target(item, existing)
            if event == "DELETE":
                changes.append(Change("delete", kind=target.kind, namespace=target.namespace,
                                      key=target.key, message_ids=message_ids))  # fmt: skip
            else:
                text, kind = _text_kind({"kind": target.kind, **item}, "memory")
                changes.append(Change("update", text, kind, namespace=target.namespace,
                                      key=target.key, message_ids=message_ids))  # fmt: skip
        return changes

    def _ask(self, system: str, content: str) -> Any:
        reply = self.model.invoke([SystemMessage(system), HumanMessage(content)])
        text = getattr(reply, "text", None)
        if not isinstance(text, str):  # not a message: a plain string, or content blocks
            text = reply if isinstance(reply, str) else str(getattr(reply, "content", reply))
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group(1)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ExtractionError(
                f"the chat model did not reply with JSON ({exc.msg} at {exc.pos}); its reply "
                f"began {text[:200]!r}. Use a model that follows JSON instructions, or pass "
                f"prompts that work with yours."
            ) from exc


def _field(reply: Any, name: str) -> list[Any]:
    if not isinstance(reply, dict) or not isinstance(reply.get(name), list):
        raise ExtractionError(
            f"the chat model's reply has no list {name!r}: {json.dumps(reply)[:200]}"
        )
    return list(reply[name])


def _text_kind(item: Any, where: str) -> tuple[str, str]:
    if not isinstance(item, dict) or not isinstance(item.get("text"), str):
        raise ExtractionError(f"an entry of {where!r} has no text: {item!r}")
    text = item["text"].strip()
    if not text:
        raise ExtractionError(f"an entry of {where!r} has an empty text")
    kind = item.get("kind", FACT)
    if kind not in KINDS:
        kind = FACT
    return text, kind


def _target(item: dict[str, Any], existing: Sequence[Existing]) -> Existing:
    raw = item.get("id")
    index = int(raw) if isinstance(raw, str | int) and str(raw).isdigit() else -1
    if not 0 <= index < len(existing):
        raise ExtractionError(
            f"the model's {item.get('event')} names memory id {raw!r}, which was not "
            f"offered (ids 0..{len(existing) - 1})"
        )
    return existing[index]
