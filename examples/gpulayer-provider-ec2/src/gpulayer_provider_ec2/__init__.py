"""gpulayer-provider-ec2: EC2 instances that boot GPUlayer workers for ``cloud`` jobs.

An example third-party provider. Installing the distribution is all it takes: its entry
point (group ``gpulayer``, name ``ec2``) loads this module, whose hook offers the adapter;
a providers.toml section with ``type = "ec2"`` then configures one provider of this kind.
It imports nothing from GPUlayer but :mod:`gpulayer.plugin`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpulayer import plugin
from gpulayer_provider_ec2.config import Ec2Config, RegionConfig
from gpulayer_provider_ec2.provider import LABEL_TAG, MACHINE_TAG, Ec2Provider
from gpulayer_provider_ec2.userdata import user_data

__all__ = ["LABEL_TAG", "MACHINE_TAG", "Ec2Config", "Ec2Provider", "RegionConfig", "create", "user_data"]


def create(instance_name: str, config: Any) -> Ec2Provider:
    """The adapter's factory: GPUlayer passes the section name and the validated model."""
    return Ec2Provider(instance_name, config if isinstance(config, Ec2Config) else Ec2Config.model_validate(config))


@plugin.hookimpl
def gpulayer_provider_adapters() -> Iterator[plugin.ProviderAdapter]:
    yield plugin.ProviderAdapter(name="ec2", description="Amazon EC2 instances (boto3)", config=Ec2Config, create=create)
