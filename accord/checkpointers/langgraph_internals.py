"""Every use accord makes of LangGraph's private API, in one place (not generated).

A checkpointer sees only ``get_tuple``/``put``/``put_writes`` calls; to know which
*run* a call belongs to, when that run ends, and how it saves, accord reads a few things
LangGraph does not publish. They are all here, each with what it is for, and
:func:`problems` checks the installed LangGraph still has each of them (the test
``tests/checkpointers/test_langgraph_internals.py`` fails naming what changed, so a
LangGraph release that breaks one is caught before a user meets it). docs/checkpointer.md
("LangGraph's private API") lists them.

* The running task's configurable keys (``langgraph._internal._constants``): ``send``
  (where a node's writes go: business writes ride on it), ``checkpointer``,
  ``durability`` and ``runtime`` (the invocation's ``Runtime``, whose ``control`` is shared
  by every loop and task of one top-level invocation: the run's identity).
* The loop (``langgraph.pregel._loop.PregelLoop``): its ``__enter__``/``__aenter__`` calls
  ``get_tuple`` first (that call is how a run is recognised: :func:`calling_loop`); its
  ``checkpoint_config``, ``is_nested``, ``config``, ``durability``, ``checkpoint`` and
  ``specs`` attributes; its exit stack ``stack`` (the run's release is pushed on it); its
  ``_first`` method (the rest of ``__enter__`` after loading the thread: wrapped so that
  a run whose start fails is released at once); its ``submit`` (the background executor
  ``__enter__`` sets before ``_first``) and ``_checkpointer_put_after_previous`` (the save
  it submits, with the checkpoint as fourth argument): :func:`detach_handed_checkpoints`.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any

#: LangGraph's configurable keys of the running task (langgraph._internal._constants).
CONFIG_SEND = "__pregel_send"
CONFIG_CHECKPOINTER = "__pregel_checkpointer"
CONFIG_DURABILITY = "__pregel_durability"
CONFIG_RUNTIME = "__pregel_runtime"

_CONSTANTS = {
    "CONFIG_KEY_SEND": CONFIG_SEND,
    "CONFIG_KEY_CHECKPOINTER": CONFIG_CHECKPOINTER,
    "CONFIG_KEY_DURABILITY": CONFIG_DURABILITY,
    "CONFIG_KEY_RUNTIME": CONFIG_RUNTIME,
}
#: Attributes of the loop accord reads (set in ``PregelLoop.__init__``).
_LOOP_ATTRIBUTES = (
    "checkpoint_config", "is_nested", "config", "durability", "specs", "stack",
)  # fmt: skip
#: How many frames above a saver's entry point to look for LangGraph's loop (the loop's
#: ``__enter__`` calls ``get_tuple`` directly, or through ``checkpoint_superseded``).
_FRAMES = 4


def calling_loop() -> Any | None:
    """LangGraph's ``PregelLoop`` whose ``__enter__``/``__aenter__`` is calling the saver
    (``get_tuple``/``aget_tuple``), or None for any other caller (``graph.get_state``,
    direct use). Call it first thing in the saver's entry point.

    Duck-typed (no import of LangGraph's private modules at run time): a frame of a
    method named ``__enter__``/``__aenter__`` whose ``self`` has the loop's attributes.
    """
    here = inspect.currentframe()  # this function's frame
    frame: Any = here.f_back.f_back if here is not None and here.f_back is not None else None
    for _ in range(_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name in ("__enter__", "__aenter__"):
            obj = frame.f_locals.get("self")
            if (
                obj is not None
                and type(obj).__module__.startswith("langgraph.")
                and hasattr(obj, "checkpoint_config")
                and hasattr(obj, "stack")
                and hasattr(obj, "is_nested")
            ):
                return obj
        frame = frame.f_back
    return None


def anchor_of(config: Mapping[str, Any] | None) -> Any | None:
    """The run tree's anchor in ``config``: LangGraph's per-invocation ``RunControl``
    (shared by nested loops and tasks), else the ``Runtime`` itself, else None."""
    runtime = runtime_of(config)
    if runtime is None:
        return None
    control = getattr(runtime, "control", None)
    return control if control is not None else runtime


def runtime_of(config: Mapping[str, Any] | None) -> Any | None:
    """The invocation's ``Runtime`` in a task's config, or None."""
    conf = (config or {}).get("configurable") or {}
    return conf.get(CONFIG_RUNTIME) if isinstance(conf, Mapping) else None


def is_top_level(loop: Any) -> bool:
    """Whether ``loop`` is a top-level invocation's (not a subgraph's)."""
    return not getattr(loop, "is_nested", True)


def loop_config(loop: Any) -> Any:
    """The config the loop was started with."""
    return getattr(loop, "config", None)


def saves_in_background(loop: Any) -> bool:
    """Whether ``loop`` does not wait for its puts (``durability="async"``)."""
    return getattr(loop, "durability", None) == "async"


def current_checkpoint_id(loop: Any) -> str | None:
    """The id of the checkpoint the loop has reached."""
    checkpoint = getattr(loop, "checkpoint", None)
    if not isinstance(checkpoint, Mapping):
        return None
    current = checkpoint.get("id")
    return current if isinstance(current, str) else None


def uses_delta_channels(loop: Any) -> bool:
    """Whether the loop's graph has DeltaChannels (its channel specs): LangGraph then
    saves a checkpoint only after its tasks' writes."""
    specs = getattr(loop, "specs", None)
    if not isinstance(specs, Mapping):
        return False
    return any(type(spec).__name__ == "DeltaChannel" for spec in specs.values())


def exit_stack(loop: Any) -> Any:
    """The loop's exit stack (``ExitStack`` or ``AsyncExitStack``): what is pushed on it
    runs when the loop exits, after its background saves finished."""
    return loop.stack


def on_start_failure(loop: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` if the rest of the loop's ``__enter__`` after loading the thread
    (its ``_first``) raises: Python then never calls its ``__exit__``."""
    first = getattr(loop, "_first", None)
    if first is None:
        return

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return first(*args, **kwargs)
        except BaseException:
            callback()
            raise

    loop._first = guarded


def detach_handed_checkpoints(loop: Any, detach: Callable[[Any], Any]) -> None:
    """Make the loop pass each checkpoint it hands to a background save through
    ``detach``, in its own thread, as it submits the save.

    ``copy_checkpoint`` is shallow: a fan-in barrier's set of seen nodes in the copy is
    the live one, which the loop changes in place when the next step's nodes finish. The
    save runs later in another thread (after the previous save returned), so anything it
    copies may already hold the next step's nodes. Called from the loop's ``_first``
    (``submit`` is set just before it), so every save of the run, the input's included,
    is detached."""
    submit = getattr(loop, "submit", None)
    save = getattr(loop, "_checkpointer_put_after_previous", None)
    if submit is None or save is None:
        return

    def submitting(executor: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn == save and len(args) >= 4:
            args = (*args[:3], detach(args[3]), *args[4:])
        return submit(fn, *args, **kwargs)

    # a bound method, as the loop's own is: LangGraph takes ``WeakMethod(loop.submit)``
    loop.submit = types.MethodType(submitting, getattr(submit, "__self__", loop))


def before_first(loop: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` in the loop's thread when ``__enter__`` calls ``_first`` (after
    loading the thread and setting the loop's ``submit``, before anything is saved)."""
    first = getattr(loop, "_first", None)
    if first is None:
        return

    def starting(*args: Any, **kwargs: Any) -> Any:
        callback()
        return first(*args, **kwargs)

    loop._first = starting


def problems() -> list[str]:
    """What the installed LangGraph no longer has of the above (empty: all there)."""
    found: list[str] = []
    try:
        from langgraph._internal import _constants
        from langgraph.pregel import _loop
        from langgraph.runtime import Runtime
    except ImportError as exc:
        return [f"a LangGraph module accord reads moved: {exc}"]
    for name, value in _CONSTANTS.items():
        actual = getattr(_constants, name, None)
        if actual != value:
            found.append(f"langgraph._internal._constants.{name} is {actual!r}, not {value!r}")
    for cls in (_loop.SyncPregelLoop, _loop.AsyncPregelLoop):
        enter = "__enter__" if cls is _loop.SyncPregelLoop else "__aenter__"
        if enter not in vars(cls):
            found.append(f"{cls.__name__} has no {enter}")
        elif "get_tuple" not in inspect.getsource(getattr(cls, enter)):
            found.append(f"{cls.__name__}.{enter} no longer loads the thread (get_tuple)")
        if not callable(getattr(cls, "_first", None)):
            found.append(f"{cls.__name__} has no _first method")
        if not callable(getattr(cls, "_checkpointer_put_after_previous", None)):
            found.append(f"{cls.__name__} has no _checkpointer_put_after_previous method")
    put_source = inspect.getsource(_loop.PregelLoop._put_checkpoint)
    if not re.search(
        r"self\.submit\(\s*self\._checkpointer_put_after_previous,.*?delta_write_futs,"
        r"\s*self\.checkpoint_config,\s*copy_checkpoint\(self\.checkpoint\)",
        put_source,
        re.DOTALL,
    ):
        found.append(
            "PregelLoop._put_checkpoint no longer submits _checkpointer_put_after_previous "
            "with the checkpoint as its fourth argument"
        )
    assigned: set[str] = set()
    for loop_class in (_loop.PregelLoop, _loop.SyncPregelLoop, _loop.AsyncPregelLoop):
        source = inspect.getsource(loop_class)
        assigned.update(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=", source))
    for attr in (*_LOOP_ATTRIBUTES, "checkpoint", "submit"):
        if attr not in assigned:
            found.append(f"PregelLoop no longer sets self.{attr}")
    if "control" not in {f.name for f in dataclasses.fields(Runtime)}:
        found.append("langgraph.runtime.Runtime has no `control` field")
    return found
