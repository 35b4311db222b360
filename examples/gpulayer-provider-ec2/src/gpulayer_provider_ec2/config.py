"""The providers.toml section of an ``ec2`` provider, validated by GPUlayer with this model.

::

    [aws]
    type = "ec2"                      # GPUlayer's own keys (type, max_machines, ...) are
    max_machines = 4                  # taken out before this model sees the section
    instance_types = ["g5.xlarge", "g5.12xlarge"]   # default (left out): every type in the table

    [aws.regions.us-east-1]
    ami = "ami-0123456789abcdef0"     # an image with Python and gpulayer installed
    subnet = "subnet-0abc"            # optional: the default VPC's otherwise
    security_groups = ["sg-0abc"]     # optional

Credentials come from boto3's usual chain (environment, ``~/.aws``, an instance role);
``profile`` picks a named profile. None of them are written in providers.toml.

What would give no offers, or wrong ones, is refused when the file is loaded: an empty
``instance_types`` (leave the key out to allow every type), a price below 0 (or not a
finite number), and a type in ``instance_types`` that has a price in none of the configured
regions (it could never be offered).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer_provider_ec2.catalog import CATALOG

#: a price per hour, US dollars
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class RegionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ami: str = Field(description="image id in this region; it must have Python and gpulayer installed")
    subnet: str | None = Field(default=None, description="subnet id (default: the default VPC's)")
    security_groups: list[str] = Field(default_factory=list, description="security group ids")

    @field_validator("ami")
    @classmethod
    def _ami(cls, v: str) -> str:
        if not re.fullmatch(r"ami-[0-9a-f]{8,17}", v):
            raise ValueError(f"{v!r} is not an image id; accepted: ami- followed by 8 to 17 hex digits")
        return v


class Ec2Config(BaseModel):
    """Everything but credentials: regions and their images, what may be launched, how."""

    model_config = ConfigDict(extra="forbid")

    regions: dict[str, RegionConfig] = Field(min_length=1, description="region name -> its image and network")
    instance_types: list[str] | None = Field(default=None, description="types that may be launched (default: all)")
    #: type -> region -> price per hour, over the built-in table
    prices: dict[str, dict[str, Price]] = Field(default_factory=dict)
    key_name: str | None = Field(default=None, description="an EC2 key pair for SSH access (default: none)")
    profile: str | None = Field(default=None, description="a named AWS profile (default: boto3's chain)")
    endpoint_url: str | None = Field(default=None, description="another EC2 endpoint (moto in tests)")
    python: str = Field(default="python3", description="the image's Python that has gpulayer installed")
    python_version: str = Field(default="3.12", description="its version, as offers report it")
    frameworks: dict[str, str] = Field(default_factory=dict, description="frameworks on the image, name -> version")

    @field_validator("instance_types", "prices")
    @classmethod
    def _known_types(cls, v: list[str] | dict[str, dict[str, float]] | None) -> object:
        unknown = sorted(set(v or ()) - set(CATALOG))
        if unknown:
            raise ValueError(f"unknown instance type {unknown[0]!r}; accepted: {', '.join(CATALOG)}")
        return v

    @field_validator("instance_types")
    @classmethod
    def _some_types(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("an empty list allows no instance type, so nothing would ever be offered; "
                             "leave instance_types out to allow every type, or name the types")
        return v

    @model_validator(mode="after")
    def _priced(self) -> Ec2Config:
        for region in self.regions:
            if not any(self.price(t, region) is not None for t in CATALOG):
                raise ValueError(f"region {region!r} has no prices; give them with prices.<type>.{region} "
                                 f"or use one of {', '.join(sorted({r for t in CATALOG.values() for r in t.prices}))}")
        for name in self.instance_types or ():
            if all(self.price(name, region) is None for region in self.regions):
                raise ValueError(f"instance_types: {name!r} has no price in {', '.join(self.regions)}, so it "
                                 f"would never be offered; give one with prices.\"{name}\".REGION = PRICE, "
                                 f"or leave it out")
        return self

    def allowed(self) -> list[str]:
        return list(self.instance_types or CATALOG)

    def price(self, instance_type: str, region: str) -> float | None:
        own = self.prices.get(instance_type, {})
        return own[region] if region in own else CATALOG[instance_type].prices.get(region)
