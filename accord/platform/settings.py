"""Configuration from the environment (``MONGODB_URI``, ``ACCORD_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
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
