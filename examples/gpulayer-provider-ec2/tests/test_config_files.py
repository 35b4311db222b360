"""The package's providers.toml examples (its README, its config docstring and GPUlayer's
docs) load through GPUlayer's own loader with this adapter, and a bad section's error names
the key as it is written in the file."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer import plugin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parents[1]  # the GPUlayer checkout this example lives in
_TOML = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)


def ec2_blocks() -> list[tuple[str, str]]:
    pages = [PACKAGE / "README.md", REPO / "docs" / "providers.md", REPO / "docs" / "plugins.md"]
    found = [(f"{page.name}:{n}", body) for page in pages if page.is_file()
             for n, body in enumerate(_TOML.findall(page.read_text())) if 'type = "ec2"' in body]
    from gpulayer_provider_ec2 import config

    doc = (config.__doc__ or "").split("::\n", 1)[1].split("\n\n", 2)
    found.append(("config.py docstring", textwrap.dedent("\n\n".join(doc[:2]))))
    return found


def test_the_examples_are_found() -> None:
    names = [name for name, _ in ec2_blocks()]
    assert any(n.startswith("README.md") for n in names) and "config.py docstring" in names


@pytest.mark.parametrize(("where", "text"), ec2_blocks(), ids=[name for name, _ in ec2_blocks()])
def test_every_example_loads(adapter: plugin.ProviderAdapter, where: str, text: str) -> None:
    tomllib.loads(text)
    [settings] = plugin.provider_settings(text, adapter, where=where).values()
    assert settings.regions


@pytest.mark.parametrize(("body", "message"), [
    ('[aws.regions.us-east-1]\namii = "ami-0123456789abcdef0"\n',
     "f.toml: [aws] regions.us-east-1.amii: not a setting of regions.us-east-1 (did you mean ami?); "
     "accepted: ami, security_groups, subnet"),
    ('instance_types = []\n[aws.regions.us-east-1]\nami = "ami-0123456789abcdef0"\n',
     "f.toml: [aws] instance_types: an empty list allows no instance type, so nothing would ever be offered; "
     "leave instance_types out to allow every type, or name the types"),
    ('prices = { "g5.xlarge" = { us-east-1 = -1.0 } }\n[aws.regions.us-east-1]\nami = "ami-0123456789abcdef0"\n',
     "f.toml: [aws] prices.g5.xlarge.us-east-1: expected a number >= 0, got -1.0"),
    ('[aws.regions.us-east-1]\nami = "ubuntu"\n',
     "f.toml: [aws] regions.us-east-1.ami: 'ubuntu' is not an image id; accepted: ami- followed by 8 to 17 hex "
     "digits"),
])
def test_a_bad_section_is_told_by_the_key_as_written(adapter: plugin.ProviderAdapter, body: str,
                                                     message: str) -> None:
    with pytest.raises(ValueError) as err:
        plugin.provider_settings('[aws]\ntype = "ec2"\n' + body, adapter, where="f.toml")
    assert str(err.value) == message
