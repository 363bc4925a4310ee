"""Extraction: from a thread's new messages to candidate long-term memories.

The aggregator hands an :class:`Extractor` one :class:`Conversation` (the new messages
one step committed, as the checkpointer stored them in ``short_term_memory``) and a
:class:`Recall` (search of the tenant's existing memories). The extractor answers with
:class:`Change` s: memories to add, or existing memories to update or delete. The
aggregator embeds them, merges near-duplicates (:mod:`accord.memory.consolidation`) and
commits them with the event's completion in one transaction.

Extractors run outside any transaction and may be slow (a model call); they must not
write anything themselves. Raising makes the aggregator retry the event with backoff and
dead-letter it after N attempts, so an extractor must be a function of its inputs (a
retry may run it again).

:class:`RuleExtractor`, the default, needs no model: it recognises explicit statements of
the user ("I prefer...", "my name is...", "remember that...") and keeps a per-thread
episodic summary of the turns. :class:`~accord.memory.llm_extractor.LLMExtractor` asks
any LangChain chat model instead (Mem0's add/update/delete pattern).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

#: Kinds of memory the built-in extractors produce (any string is allowed).
PREFERENCE, FACT, EPISODE = "preference", "fact", "episode"

#: Message roles as LangChain names them (``BaseMessage.type``).
HUMAN_ROLES = frozenset({"human", "user"})

Action = Literal["add", "update", "delete"]


@dataclass(frozen=True)
class Turn:
    """One message of a thread, as stored in ``short_term_memory``.

    ``text`` is None when the checkpointer stored no plain text (an encrypting serde):
    such messages cannot be read by the aggregator.
    """

    message_id: str
    role: str
    text: str | None
    created_at: datetime | None = None
    key: str | None = None

    @property
    def from_user(self) -> bool:
        return self.role in HUMAN_ROLES


@dataclass(frozen=True)
class Conversation:
    """The new messages of one committed step of a thread, in order."""

    tenant_id: str
    thread_id: str
    turns: Sequence[Turn]
    checkpoint_ns: str = ""
    checkpoint_id: str | None = None


@dataclass(frozen=True)
class Existing:
    """A memory the extractor may decide to update or delete."""

    namespace: tuple[str, ...]
    key: str
    text: str | None
    kind: str
    score: float
    value: Mapping[str, Any] = field(default_factory=dict)


class Recall(Protocol):
    """Search of the tenant's existing memories (what an extractor may look at)."""

    def __call__(self, text: str, *, kinds: Sequence[str] | None = None,
                 limit: int = 5) -> list[Existing]: ...  # fmt: skip


class AsyncRecall(Protocol):
    """:class:`Recall` for an extractor's ``aextract``: awaited."""

    async def __call__(self, text: str, *, kinds: Sequence[str] | None = None,
                       limit: int = 5) -> list[Existing]: ...  # fmt: skip


@dataclass(frozen=True)
class Change:
    """What an extractor proposes.

    ``add``: a new memory of ``kind`` with ``text`` (what is embedded and shown). The
    aggregator picks its namespace (from ``kind``) unless ``namespace`` is given, and its
    key: ``key`` if given (a *slot*, such as ``profile:name``: a later value replaces the
    earlier one), else one derived from the kind and the normalised text, so the same
    statement made twice is one memory. Near-duplicates are merged (consolidation)
    unless ``merge`` is False.

    ``update`` / ``delete``: ``namespace`` and ``key`` name an existing memory (one the
    :class:`Recall` returned); ``update`` replaces its text.

    ``message_ids``: the messages it came from (provenance).
    """

    action: Action
    text: str = ""
    kind: str = FACT
    namespace: tuple[str, ...] | None = None
    key: str | None = None
    value: Mapping[str, Any] | None = None
    message_ids: tuple[str, ...] = ()
    merge: bool = True

    def __post_init__(self) -> None:
        if self.action not in ("add", "update", "delete"):
            raise ValueError(f"a change is 'add', 'update' or 'delete', not {self.action!r}")
        if self.action != "delete" and not (isinstance(self.text, str) and self.text.strip()):
            raise ValueError(f"an {self.action!r} change needs a non-empty text")
        if self.action != "add" and (self.namespace is None or self.key is None):
            raise ValueError(f"an {self.action!r} change names the memory: namespace and key")


@runtime_checkable
class Extractor(Protocol):
    """Turns a conversation into changes of long-term memory (see the module docstring)."""

    name: str

    def extract(self, conversation: Conversation, recall: Recall) -> list[Change]: ...


def run_extractor(extractor: Extractor, conversation: Conversation, recall: Recall) -> list[Change]:
    """The changes ``extractor`` proposes (how the sync aggregator calls it)."""
    return list(extractor.extract(conversation, recall))


async def arun_extractor(
    extractor: Extractor, conversation: Conversation, recall: AsyncRecall
) -> list[Change]:
    """The changes ``extractor`` proposes, for the async aggregator: its ``aextract``
    (``async def aextract(conversation, recall)``, ``recall`` awaited) when it has one;
    otherwise its ``extract`` in a worker thread, so a slow or CPU-bound extractor never
    blocks the event loop, with each ``recall`` it makes served on this loop."""
    aextract = getattr(extractor, "aextract", None)
    if aextract is not None:
        return list(await aextract(conversation, recall))
    loop = asyncio.get_running_loop()

    def recall_on_loop(
        text: str, *, kinds: Sequence[str] | None = None, limit: int = 5
    ) -> list[Existing]:
        # the loop is free: it is awaiting this thread
        return asyncio.run_coroutine_threadsafe(
            recall(text, kinds=kinds, limit=limit), loop
        ).result()

    return list(await asyncio.to_thread(extractor.extract, conversation, recall_on_loop))


def normalise(text: str) -> str:
    """Lower case, single spaces, no trailing punctuation: what 'the same statement' means."""
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(" .!?;,")


def content_key(kind: str, text: str) -> str:
    """The key of a memory that has no slot: the same statement gets the same key."""
    digest = hashlib.blake2b(f"{kind}\x00{normalise(text)}".encode(), digest_size=12)
    return f"{kind}:{digest.hexdigest()}"


# -- the deterministic default ---------------------------------------------------------------

_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_END = r"(?P<x>[^.!?;\n]{1,200}?)\s*(?:$|[.!?;])"
#: Words a statement may start with ("Actually, my name is...", "Oh and I prefer...").
_LEAD = (
    r"^(?:(?:and|also|btw|oh|actually|well|so|ok|okay|hey|hi|yes|no|fyi|by the way|"
    r"just so you know|for the record|for your information|one more thing)[,:!]?\s+)*"
)


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    template: str
    slot: str | None = None


def _rule(kind: str, pattern: str, template: str, slot: str | None = None) -> _Rule:
    return _Rule(kind, re.compile(_LEAD + pattern + _END, re.IGNORECASE), template, slot)


#: Statements the rule extractor recognises, first match wins (per sentence). A slot
#: makes the memory replace the previous value ("my name is Bob", later "my name is Rob";
#: ``{what}`` in a slot is the attribute named: "my city is..." -> ``profile:city``).
RULES: tuple[_Rule, ...] = (
    _rule(FACT, r"(?:please\s+)?(?:remember|note|don'?t forget)\s+(?:that\s+)?", "{x}"),
    _rule(FACT, r"my name is\s+", "User's name is {x}", slot="profile:name"),
    _rule(FACT, r"(?:please\s+)?call me\s+", "User's name is {x}", slot="profile:name"),
    _rule(FACT, r"i live in\s+", "User lives in {x}", slot="profile:location"),
    _rule(FACT, r"i(?:'m| am) based in\s+", "User lives in {x}", slot="profile:location"),
    _rule(FACT, r"i work (?:at|for)\s+", "User works at {x}", slot="profile:employer"),
    _rule(FACT, r"i(?:'m| am) allergic to\s+", "User is allergic to {x}"),
    _rule(
        PREFERENCE,
        r"my favou?rite (?P<what>[a-z][a-z ]{0,40}?) is\s+",
        "User's favorite {what} is {x}",
        slot="favorite:{what}",
    ),  # fmt: skip
    _rule(
        FACT,
        r"my (?P<what>[a-z][a-z ]{0,40}?) is\s+",
        "User's {what} is {x}",
        slot="profile:{what}",
    ),  # fmt: skip
    _rule(PREFERENCE, r"i (?:really\s+)?prefer\s+", "User prefers {x}"),
    _rule(PREFERENCE, r"i (?:really\s+)?(?:like|love|enjoy)\s+", "User likes {x}"),
    _rule(PREFERENCE, r"i (?:really\s+)?(?:don'?t|do not) like\s+", "User does not like {x}"),
    _rule(PREFERENCE, r"i (?:really\s+)?(?:hate|dislike)\s+", "User dislikes {x}"),
    _rule(PREFERENCE, r"i (?:always|usually)\s+", "User always {x}"),
    _rule(PREFERENCE, r"i never\s+", "User never {x}"),
)

#: ``my <what> is`` statements that are not facts about the user.
_NOT_FACTS = frozenset({"question", "point", "guess", "answer", "problem", "issue", "bad",
                        "pleasure", "concern", "idea", "plan"})  # fmt: skip


def statements(text: str) -> list[tuple[str, str, str | None]]:
    """``(kind, memory text, slot)`` for each explicit statement in ``text``."""
    out = []
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip().strip("\"'")
        if not sentence or sentence.endswith("?"):
            continue  # questions state nothing
        for rule in RULES:
            m = rule.pattern.match(sentence)
            if m is None:
                continue
            parts = {k: (v or "").strip() for k, v in m.groupdict().items()}
            if "what" in parts and parts["what"].lower() in _NOT_FACTS:
                break
            if not parts["x"]:
                break
            memory = rule.template.format(**parts)
            memory = memory[0].upper() + memory[1:]
            slot = rule.slot
            if slot is not None and "what" in parts:
                slot = slot.format(what=re.sub(r"\s+", "_", parts["what"].lower()))
            out.append((rule.kind, memory, slot))
            break
    return out


#: How many turns an episodic summary keeps (the most recent ones).
EPISODE_TURNS = 40
_GIST = 160


def gist(text: str) -> str:
    """``text`` on one line, at most 160 characters."""
    flat = re.sub(r"\s+", " ", text.strip())
    return flat if len(flat) <= _GIST else flat[: _GIST - 1].rstrip() + "…"


class RuleExtractor:
    """The deterministic default: no model, the same output for the same input.

    - explicit statements of the user (:data:`RULES`): preferences and facts, one memory
      each; slotted facts (name, location, employer, ``my X is Y``) replace the previous
      value of the slot;
    - with ``episodes`` (default on): one *episode* memory per thread whose value holds
      the gist of each turn (``turns``: message id, role, first sentence, time; the last
      :data:`EPISODE_TURNS`) and whose text summarises what the user said. Each step adds
      its turns to it; the aggregator merges them by message id, so the order in which
      steps are aggregated does not matter.

    Only messages of the user are mined for statements (an assistant saying "I prefer"
    is not the user's preference).
    """

    name = "rules"

    def __init__(self, *, episodes: bool = True) -> None:
        self.episodes = episodes

    def extract(self, conversation: Conversation, recall: Recall) -> list[Change]:
        changes: list[Change] = []
        for turn in conversation.turns:
            if not turn.from_user or not turn.text:
                continue
            for kind, text, slot in statements(turn.text):
                changes.append(
                    Change("add", text, kind, key=slot, message_ids=(turn.message_id,),
                           value={"content": text, "slot": slot} if slot else None)
                )  # fmt: skip
        if self.episodes:
            episode = episode_change(conversation)
            if episode is not None:
                changes.append(episode)
        return changes


def episode_key(thread_id: str) -> str:
    return f"episode:{thread_id}"


def episode_change(conversation: Conversation) -> Change | None:
    """This step's contribution to the thread's episodic summary (None: no readable turn)."""
    turns: list[dict[str, Any]] = [
        {
            "message_id": t.message_id,
            "role": t.role,
            "gist": gist(t.text),  # type: ignore[arg-type]
            "at": t.created_at,
            "checkpoint_id": conversation.checkpoint_id,
            "n": n,
        }
        for n, t in enumerate(conversation.turns)
        if t.text and t.text.strip() and t.role in HUMAN_ROLES | {"ai", "assistant"}
    ]
    if not turns:
        return None
    value = {"thread_id": conversation.thread_id, "turns": turns}
    return Change(
        "add",
        episode_text(conversation.thread_id, turns),
        EPISODE,
        key=episode_key(conversation.thread_id),
        value=value,
        message_ids=tuple(t["message_id"] for t in turns),
        merge=False,
    )


def episode_text(thread_id: str, turns: Sequence[Mapping[str, Any]]) -> str:
    """The summary text of an episode: what the user said, turn by turn."""
    said = [t["gist"] for t in turns if t.get("role") in HUMAN_ROLES and t.get("gist")]
    if not said:
        said = [t["gist"] for t in turns if t.get("gist")]
    return f"Conversation {thread_id}: " + " | ".join(said)


def merge_episode(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The union of two episode values' turns by message id, oldest first, capped."""
    by_id: dict[str, Mapping[str, Any]] = {}
    for value in (old or {}, new):
        for t in value.get("turns") or ():
            if isinstance(t, Mapping) and isinstance(t.get("message_id"), str):
                by_id[t["message_id"]] = t
    ordered = sorted(by_id.values(), key=_turn_order)[-EPISODE_TURNS:]
    return {"thread_id": new.get("thread_id"), "turns": [dict(t) for t in ordered]}


def _turn_order(turn: Mapping[str, Any]) -> tuple[Any, ...]:
    # Steps are ordered by their time, then by their checkpoint id (BSON dates keep only
    # milliseconds, and several steps of a fast graph share one; LangGraph's checkpoint ids
    # are uuid6, ordered by a 100 ns clock and the step); the turns of one step by their
    # position in it.
    at = turn.get("at")
    if isinstance(at, datetime) and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)  # BSON dates come back naive, in UTC
    stamp = at.timestamp() if isinstance(at, datetime) else 0.0
    checkpoint = turn.get("checkpoint_id")
    step = checkpoint if isinstance(checkpoint, str) else ""
    return (at is None, stamp, step, turn.get("n", 0), turn["message_id"])
