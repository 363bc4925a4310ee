"""Configuration from the environment (``MONGODB_URI``, ``ACCORD_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from accord.errors import ConfigurationError


class EnvironmentSettings(BaseSettings):
    """Settings read from ``ACCORD_*`` variables: a value that does not validate is a
    :class:`~accord.errors.ConfigurationError` naming the variable (not pydantic's
    traceback)."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{_variable(type(self), err['loc'])}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ConfigurationError(
                f"the environment's settings are refused: {problems}; fix or unset them"
            ) from None


def _variable(cls: type[BaseSettings], loc: tuple[Any, ...]) -> str:
    name = str(loc[0]) if loc else "?"
    field = cls.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, str):
        return alias
    prefix = str(cls.model_config.get("env_prefix") or "")
    return f"{prefix}{name}".upper()


class Settings(EnvironmentSettings):
    """Where accord's data lives. Read from the environment; no globals."""

    model_config = SettingsConfigDict(env_prefix="ACCORD_", extra="ignore")

    mongodb_uri: str | None = Field(
        default=None,
        validation_alias="MONGODB_URI",
        description="A real MongoDB (Atlas, Atlas Local, replica set). Unset: the embedded engine.",
    )
    data_dir: Path = Field(
        default=Path(".accord/data"), description="Embedded engine data directory."
    )
    engine_sync: bool = Field(default=True, description="fsync each commit of the embedded engine.")
    server_selection_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds connect() waits for a MongoDB server before it reports it "
        "unreachable (a URI's serverSelectionTimeoutMS wins).",
    )
    engine_start_timeout: float = Field(
        default=20.0, gt=0, description="Seconds to wait for the engine."
    )
    database: str = Field(
        default="accord", min_length=1, description="Database accord's collections live in."
    )
