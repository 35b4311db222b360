"""The base class of GPUlayer's pydantic records."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """A record with a fixed set of fields: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=False)
