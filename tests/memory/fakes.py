"""Fakes for the memory tests: a deterministic FAKE chat model (a real LangChain
``BaseChatModel`` with no network and no randomness) that answers accord's LLM
extractor's two prompts by fixed rules, so the extractor's add / update / delete logic is
tested end to end without a model."""

from __future__ import annotations

import json
import re
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from accord.memory.llm_extractor import DECIDE_PROMPT, FACTS_PROMPT

_FACT_RULES = [
    (re.compile(r"\bmy (\w+) is ([^.!?]+)", re.I), "User's {0} is {1}", "fact"),
    (re.compile(r"\bi no longer like ([^.!?]+)", re.I), "User no longer likes {0}", "preference"),
    (re.compile(r"\bi (?:like|love) ([^.!?]+)", re.I), "User likes {0}", "preference"),
]


class FakeChatModel(BaseChatModel):
    """FAKE chat model. Facts prompt: "my X is Y", "I like X", "I no longer like X" in the
    human lines become facts. Decide prompt: "User's X is ..." updates an existing
    "User's X is ..."; "User no longer likes X" deletes "User likes X"; a fact already
    known verbatim is NONE; anything else is ADD. ``mode`` breaks it on purpose:
    ``"prose"`` (not JSON), ``"invent"`` (an UPDATE of an id that was not offered)."""

    mode: str = "ok"
    calls: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "fake-accord-chat"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:  # fmt: skip
        system, human = str(messages[0].content), str(messages[-1].content)
        self.calls.append(system[:20])
        if self.mode == "prose":
            reply = "Sure! The user seems to like trains."
        elif system == FACTS_PROMPT:
            reply = "```json\n" + json.dumps({"facts": self._facts(human)}) + "\n```"
        elif system == DECIDE_PROMPT:
            reply = json.dumps({"memory": self._decide(json.loads(human))})
        else:
            reply = "{}"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(reply))])

    def _facts(self, transcript: str) -> list[dict[str, str]]:
        facts = []
        for line in transcript.splitlines():
            if not line.startswith("human:"):
                continue
            for sentence in re.split(r"[.!?]", line):
                for pattern, template, kind in _FACT_RULES:
                    m = pattern.search(sentence)
                    if m:
                        text = template.format(*(g.strip() for g in m.groups()))
                        facts.append({"text": text, "kind": kind})
                        break
        return facts

    def _decide(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        existing = payload["existing"]
        out: list[dict[str, Any]] = []
        for fact in payload["new_facts"]:
            text = fact["text"]
            if any(e["text"] == text for e in existing):
                out.append({"event": "NONE", "text": text})
                continue
            if self.mode == "invent":
                out.append({"id": "99", "event": "UPDATE", "text": text})
                continue
            attr = re.match(r"User's (\w+) is ", text)
            gone = re.match(r"User no longer likes (.+)", text)
            target = None
            for e in existing:
                if attr and e["text"].startswith(attr.group(0)):
                    target = {"id": e["id"], "event": "UPDATE", "text": text, "kind": "fact"}
                elif gone and e["text"] == f"User likes {gone.group(1)}":
                    target = {"id": e["id"], "event": "DELETE"}
            out.append(target or {"event": "ADD", "text": text, "kind": fact["kind"]})
        return out
