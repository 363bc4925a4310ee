"""The one exception hierarchy of accord.

Every message says what happened and what to do about it.
"""

from __future__ import annotations


class AccordError(Exception):
    """Base class of every error accord raises on purpose."""


class ConfigurationError(AccordError, ValueError):
    """A setting, argument or policy value is invalid."""


class InvalidInputError(AccordError, ValueError):
    """A caller passed a value accord refuses before touching the database."""


class EngineStartError(AccordError):
    """The embedded engine could not be started or reached."""


class DataDirLockedError(EngineStartError):
    """Another engine process already owns the data directory."""


class ConcurrentRunError(AccordError):
    """Another worker advanced the same thread; this worker's step was not written."""


class PermissionDenied(AccordError):
    """The principal lacks the privilege for this action on this artifact class."""


class BundleMismatch(AccordError):
    """A run was started on a different code/prompt/model bundle than the one resuming it."""
