"""Bundles: the code, prompts and models a run was started on, pinned to its thread.

A paused run (waiting for an approval, or crashed) resumes on whatever is deployed when
it wakes; if the graph's code, a prompt or the model changed meanwhile, it resumes on a
combination nobody tested, or loads state the new code does not expect. So a thread is
*pinned* to the bundle its first run started on, and every later run of the thread is
checked against it (:mod:`accord.checkpointers.bundles` does the checking for LangGraph):

* the same bundle: the run goes on;
* another bundle, with migrations registered from the pinned version to the new one
  (:class:`Migrations`): the thread's state is migrated first, and the pin moves on;
* another bundle with an explicit override (a security fix that must reach paused runs):
  the pin moves on, the override (reason, by whom) recorded;
* otherwise :class:`~accord.errors.BundleMismatch`, naming what changed.

The pin lives on the thread's run-registry document (DESIGN.md: the ``run`` class holds
"status, lease, bundle version"): ``bundle`` (the pinned bundle's document) and
``bundle_history`` (every pin, migration and override, with when and by whom). It is
written through the kernel with the free guard, like every write that belongs to no run.

Everything here is pure; :mod:`accord.platform.asynchronous.bundle_pins` runs it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from accord.errors import BundleMismatch, ConfigurationError
from accord.platform.plan import Op
from accord.platform.runs import run_doc_id

#: A state migration: the thread's state values under the old bundle -> the updates that
#: make them right for the new one (applied as a LangGraph state update).
Migration = Callable[[dict[str, Any]], Mapping[str, Any]]


def text_digest(text: str) -> str:
    """The digest of a prompt (or any text a bundle pins): ``sha256:`` + 16 hex digits."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Bundle:
    """What a run was started on, declared by the application.

    ``version``: the application's name for the bundle (``"2026-12-05.1"``, a git tag):
    migrations are registered between versions. ``code``: the graph code's version or
    digest (e.g. :func:`accord.checkpointers.bundles.fingerprint` of the compiled graph).
    ``prompts``: prompt name -> text or digest (texts are digested: :func:`text_digest`).
    ``models``: model role -> model id (``"chat": "claude-sonnet-4-5"``).
    """

    version: str
    code: str | None = None
    prompts: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ConfigurationError(f"a bundle's version must be a non-empty string, got "
                                     f"{self.version!r}")  # fmt: skip
        prompts = {
            str(k): v if v.startswith("sha256:") else text_digest(v)
            for k, v in dict(self.prompts).items()
        }
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "models", {str(k): str(v) for k, v in dict(self.models).items()})

    def parts(self) -> dict[str, str | None]:
        """Every pinned part by name: ``version``, ``code``, ``prompt:NAME``,
        ``model:NAME``."""
        out: dict[str, str | None] = {"version": self.version, "code": self.code}
        out.update({f"prompt:{k}": v for k, v in sorted(self.prompts.items())})
        out.update({f"model:{k}": v for k, v in sorted(self.models.items())})
        return out

    @property
    def digest(self) -> str:
        raw = json.dumps(self.parts(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()

    def document(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "code": self.code,
            "prompts": dict(self.prompts),
            "models": dict(self.models),
            "digest": self.digest,
        }

    @classmethod
    def of_document(cls, doc: Mapping[str, Any]) -> Bundle:
        return cls(
            version=str(doc["version"]),
            code=doc.get("code"),
            prompts=dict(doc.get("prompts") or {}),
            models=dict(doc.get("models") or {}),
        )


def changes(old: Bundle, new: Bundle) -> dict[str, tuple[str | None, str | None]]:
    """The parts that differ between ``old`` and ``new``: name -> (old, new)."""
    a, b = old.parts(), new.parts()
    return {k: (a.get(k), b.get(k)) for k in sorted({*a, *b}) if a.get(k) != b.get(k)}


@dataclass(frozen=True)
class Override:
    """Resume a thread on another bundle without a migration, on purpose (a security fix
    that must reach paused runs). Recorded in the thread's ``bundle_history``."""

    reason: str
    by: str

    def __post_init__(self) -> None:
        if not self.reason.strip() or not self.by.strip():
            raise ConfigurationError("an override needs a reason and who gives it (by=...)")


class Migrations:
    """State migrations between bundle versions, registered by the application::

        migrations = Migrations()

        @migrations.register("v1", "v2")
        def rename_total(values):
            return {"amount_cents": values["total"] * 100}

    :meth:`path` chains them (v1 -> v2 -> v3) by breadth-first search."""

    def __init__(self) -> None:
        self._steps: dict[str, dict[str, Migration]] = {}

    def register(self, from_version: str, to_version: str) -> Callable[[Migration], Migration]:
        def add(fn: Migration) -> Migration:
            if from_version == to_version:
                raise ConfigurationError("a migration goes from one version to another")
            self._steps.setdefault(from_version, {})[to_version] = fn
            return fn

        return add

    def path(self, from_version: str, to_version: str) -> list[tuple[str, str, Migration]]:
        """The migrations from ``from_version`` to ``to_version``, in order; [] when there
        is no way (or the versions are equal)."""
        if from_version == to_version:
            return []
        queue: list[tuple[str, list[tuple[str, str, Migration]]]] = [(from_version, [])]
        seen = {from_version}
        while queue:
            version, steps = queue.pop(0)
            for nxt, fn in sorted(self._steps.get(version, {}).items()):
                route = [*steps, (version, nxt, fn)]
                if nxt == to_version:
                    return route
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, route))
        return []


def mismatch(thread_id: str, pinned: Bundle, current: Bundle) -> BundleMismatch:
    """The error of a run on ``current`` of a thread pinned to ``pinned``."""
    diff = changes(pinned, current)
    listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in diff.items()))
    return BundleMismatch(
        f"thread {thread_id!r} is pinned to bundle {pinned.version!r} and this run is on "
        f"bundle {current.version!r}; what changed: {listed}. Nothing was run. Resume it on "
        f"bundle {pinned.version!r}, register a migration from {pinned.version!r} to "
        f"{current.version!r} (Migrations.register), or pass an explicit "
        f"Override(reason=..., by=...) (recorded).",
        changes=dict(diff),
    )


def history_entry(
    kind: str,
    *,
    at: datetime,
    old: Bundle | None,
    new: Bundle,
    by: str | None = None,
    reason: str | None = None,
    steps: list[str] | None = None,
) -> dict[str, Any]:
    """One entry of ``bundle_history``: ``pinned``, ``migrated`` or ``override``."""
    entry: dict[str, Any] = {"kind": kind, "at": at, "to": new.version, "to_digest": new.digest}
    if old is not None:
        entry.update({"from": old.version, "from_digest": old.digest})
    if by is not None:
        entry["by"] = by
    if reason is not None:
        entry["reason"] = reason
    if steps is not None:
        entry["steps"] = steps
    return entry


def pin_op(
    tenant_id: str,
    thread_id: str,
    bundle: Bundle,
    entry: Mapping[str, Any],
    *,
    expected: str | None,
) -> Op:
    """Pin (tenant, thread) to ``bundle``, appending ``entry`` to its history. It matches
    only while the pin is still ``expected`` (a digest; None: not pinned yet), so two
    processes that pin or migrate a thread at the same time do not both succeed: expect
    ``matched == 1``. The registry document exists (the free guard before it upserts
    it)."""
    filt: dict[str, Any] = {"_id": run_doc_id(tenant_id, thread_id)}
    filt["bundle.digest"] = expected if expected is not None else None
    return Op(
        "update",
        filt,
        {"$set": {"bundle": bundle.document()}, "$push": {"bundle_history": dict(entry)}},
    )
