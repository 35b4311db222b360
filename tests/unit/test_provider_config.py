"""Errors of a bad providers.toml (gpulayer.provider_config with the bundled ssh adapter's
model, and a model with nested tables as the EC2 example's): each names the file, the
section and the key as the user wrote it, says what is accepted at that level, and never
shows the values of a whole table (they may be secrets). Finding the file: how the user
named it is how an error names it."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpulayer_ssh import SshPoolConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import ProviderAdapter
from gpulayer.provider_config import load, parse
from tests.server_support import base_env
from tests.support import cli

SSH = {"ssh": ProviderAdapter(name="ssh", config=SshPoolConfig, create=lambda name, cfg: object())}
POOL = '[pool]\ntype = "ssh"\nuser = "u"\nkey_file = "k"\n'
HOST = '[[pool.hosts]]\nhost = "a"\n'
SHARED = ("environment", "key_file", "known_hosts", "port", "python", "state_dir", "strict_host_key_checking", "user")


def error(text: str, adapters: dict[str, ProviderAdapter] = SSH) -> str:
    with pytest.raises(InvalidInput) as err:
        parse(text, "p.toml", adapters=adapters)
    return str(err.value)


# --------------------------------------------------------------------------- no secrets


@pytest.mark.parametrize("text", [
    POOL + 'environment = { HF_TOKEN = "hf_SECRETVALUE" }\n' + HOST + HOST,  # two hosts called a
    POOL + 'environment = { HF_TOKEN = "hf_SECRETVALUE" }\n' + HOST + "cpus = 4\n",  # cpus without memory_gb
    POOL + 'environment = { HF_TOKEN = "hf_SECRETVALUE", GPULAYER_TOKEN = "x" }\n' + HOST,
    POOL + HOST + 'environment = { HF_TOKEN = "hf_SECRETVALUE", N = 3 }\n',
])
def test_an_error_never_shows_the_values_of_a_table(text: str) -> None:
    message = error(text)
    assert message.startswith("p.toml: [pool] ")
    assert "hf_SECRETVALUE" not in message and "HF_TOKEN" not in message and "{" not in message, message


def test_a_validators_own_words_are_told_without_pydantics_prefix() -> None:
    assert error(POOL + HOST + HOST) == "p.toml: [pool] hosts: hosts 0 and 1 are both called 'a'; give one a name"
    message = error(POOL + HOST + "cpus = 4\n")
    assert message.startswith("p.toml: [pool] hosts.0: declare cpus and memory_gb together")
    assert "Value error" not in message


# --------------------------------------------------------------------------- where the key was written


@pytest.mark.parametrize(("line", "message"), [
    ('port = "abc"', "p.toml: [pool] port: expected a whole number, got 'abc'"),
    ("port = 0", "p.toml: [pool] port: expected a number >= 1, got 0"),
    ('strict_host_key_checking = "maybe"',
     "p.toml: [pool] strict_host_key_checking: expected 'yes', 'accept-new' or 'no', got 'maybe'"),
    ('python = ""', "p.toml: [pool] python: expected at least 1 character(s), got ''"),
    ('environment = { GPULAYER_TOKEN = "x" }',
     "p.toml: [pool] environment: GPULAYER_TOKEN is set by GPUlayer itself for each machine; leave it out"),
])
def test_a_pool_level_key_is_named_where_it_was_written(line: str, message: str) -> None:
    assert error(POOL + line + "\n" + HOST + HOST.replace('"a"', '"b"')) == message


@pytest.mark.parametrize(("line", "message"), [
    ('port = "abc"', "p.toml: [pool] hosts.0.port: expected a whole number, got 'abc'"),
    ('strict_host_key_checking = "maybe"',
     "p.toml: [pool] hosts.0.strict_host_key_checking: expected 'yes', 'accept-new' or 'no', got 'maybe'"),
])
def test_a_host_level_key_is_named_by_its_host(line: str, message: str) -> None:
    assert error(POOL + HOST + line + "\n") == message


def test_a_pool_level_typo_lists_every_pool_key_and_suggests_the_one_meant() -> None:
    message = error(POOL + 'pyhton = "/opt/py"\n' + HOST)
    assert message.startswith("p.toml: [pool] pyhton: not a setting of ssh providers (did you mean python?); "
                              "accepted: ")
    accepted = message.split("accepted: ")[1].split(", ")
    assert set(SHARED) | {"hosts", "connect_timeout", "type", "max_machines", "idle_timeout"} <= set(accepted)
    assert accepted == sorted(accepted) and "cpus" not in accepted


def test_a_host_level_typo_lists_the_host_keys() -> None:
    message = error(POOL + HOST + 'pyhton = "/opt/py"\n')
    assert message.startswith("p.toml: [pool] hosts.0.pyhton: not a setting of hosts.0 (did you mean python?); "
                              "accepted: ")
    accepted = message.split("accepted: ")[1].split(", ")
    assert set(SHARED) | {"host", "name", "cpus", "memory_gb", "devices", "frameworks"} == set(accepted)


def test_a_misspelt_required_key_is_told_as_a_typo_not_as_the_key_missing() -> None:
    message = error('[pool]\ntype = "ssh"\nusr = "u"\nkey_file = "k"\n' + HOST)
    assert message.startswith("p.toml: [pool] usr: not a setting of ssh providers (did you mean user?); accepted: ")
    assert error('[pool]\ntype = "ssh"\nkey_file = "k"\n' + HOST) == "p.toml: [pool] hosts.0.user: missing; it is required"


def test_frameworks_are_declared_with_cpus_and_memory_or_not_at_all() -> None:
    message = error(POOL + HOST + 'frameworks = { torch = "2.5.1" }\n')
    assert message.startswith("p.toml: [pool] hosts.0: frameworks are declared with the host's cpus and memory_gb")
    assert "declare cpus and memory_gb, or leave frameworks out" in message
    [ok] = parse(POOL + HOST + 'cpus = 8\nmemory_gb = 32\nframeworks = { torch = "2.5.1" }\n', adapters=SSH)
    assert ok.settings.hosts[0].frameworks == {"torch": "2.5.1"}


def test_pool_defaults_still_reach_every_host() -> None:
    [ok] = parse(POOL + "port = 2222\n" + HOST + HOST.replace('"a"', '"b"') + "port = 22\n", adapters=SSH)
    assert [(h.user, h.key_file, h.port) for h in ok.settings.hosts] == [("u", "k", 2222), ("u", "k", 22)]


# --------------------------------------------------------------------------- nested tables (as EC2's)


class Region(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ami: str
    subnet: str | None = None


class Cloud(BaseModel):
    model_config = ConfigDict(extra="forbid")
    regions: dict[str, Region] = Field(min_length=1)
    instance_types: list[str] | None = None


CLOUD = {"cloud": ProviderAdapter(name="cloud", config=Cloud, create=lambda name, cfg: object())}


def test_a_typo_in_a_table_of_tables_is_told_with_that_tables_keys() -> None:
    message = error('[aws]\ntype = "cloud"\n[aws.regions.us-east-1]\namii = "ami-1"\n', CLOUD)
    assert message == ("p.toml: [aws] regions.us-east-1.amii: not a setting of regions.us-east-1 (did you mean ami?); "
                       "accepted: ami, subnet")


@pytest.mark.parametrize(("body", "message"), [
    ("regions = {}", "p.toml: [aws] regions: expected at least 1 item(s)"),
    ('regions = "us-east-1"', "p.toml: [aws] regions: expected a table, got 'us-east-1'"),
    ('regions = { us-east-1 = { ami = 3 } }', "p.toml: [aws] regions.us-east-1.ami: expected a string (in quotes), got 3"),
    ('regions = { us-east-1 = { ami = "a" } }\ninstance_types = "g5"',
     "p.toml: [aws] instance_types: expected a list [...], got 'g5'"),
])
def test_a_bad_value_is_told_in_gpulayers_words(body: str, message: str) -> None:
    assert error(f'[aws]\ntype = "cloud"\n{body}\n', CLOUD) == message


def _create_fails(exc: BaseException) -> ProviderAdapter:
    def create(name: str, cfg: Cloud) -> object:
        raise exc
    return ProviderAdapter(name="cloud", config=Cloud, create=create)


@pytest.mark.parametrize(("exc", "says"), [
    (RuntimeError("registry unreadable"), "RuntimeError: registry unreadable"),
    (ValueError("region us-east-1 has no endpoint"), "ValueError: region us-east-1 has no endpoint"),
    (SystemExit("giving up"), "SystemExit: giving up"),
])
def test_an_adapter_whose_create_fails_is_told_naming_the_section_and_the_adapter(exc: BaseException, says: str) -> None:
    """Not a traceback out of ``server start`` (nor its silent end, for sys.exit())."""
    text = '[aws]\ntype = "cloud"\n[aws.regions.us-east-1]\nami = "ami-1"\n'
    assert error(text, {"cloud": _create_fails(exc)}) == (
        f"p.toml: [aws] provider adapter 'cloud' could not make this provider: create() raised {says}")


class Picky(BaseModel):
    region: str

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        return {"us-east-1": v}[v]  # a KeyError: not a ValueError, so pydantic passes it on


def test_a_config_model_that_raises_other_than_valueerror_is_told_naming_the_adapter() -> None:
    adapters = {"picky": ProviderAdapter(name="picky", config=Picky, create=lambda name, cfg: object())}
    assert error('[p]\ntype = "picky"\nregion = "mars"\n', adapters) == (
        "p.toml: [p] provider adapter 'picky' could not read this section: its config model raised KeyError: 'mars'")


# --------------------------------------------------------------------------- the file


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'[pool]\ntype = "ssh"\nuser = "\xff\xfe"\n')
    with pytest.raises(InvalidInput) as err:
        load(path)
    assert str(err.value) == f"{path}: line 3: not UTF-8 text (byte 0xff); a TOML file is UTF-8: save it as UTF-8"


def test_a_missing_file_is_named_as_the_user_gave_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput, match=r"^--providers /nope\.toml: no such file$"):
        load("/nope.toml")
    monkeypatch.setenv("GPULAYER_PROVIDERS", "/nope.toml")
    with pytest.raises(InvalidInput, match=r"^GPULAYER_PROVIDERS='/nope\.toml': no such file$"):
        load()
    with pytest.raises(InvalidInput, match=r"^--providers /nope2\.toml: no such file$"):
        load("/nope2.toml")  # the flag wins over the variable
    monkeypatch.setenv("GPULAYER_PROVIDERS", str(tmp_path))
    with pytest.raises(InvalidInput, match=r"^GPULAYER_PROVIDERS='.*': cannot read it: Is a directory$"):
        load()


def test_server_start_refuses_a_file_that_is_not_utf8_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'[pool]\ntype = "ssh"\nuser = "\xff"\n')
    out = cli("server", "start", "--port", "0", "--providers", str(path), env=base_env(tmp_path / "home"), timeout=60)
    assert (out.returncode, out.stderr.strip()) == (
        2, f"error: {path}: line 3: not UTF-8 text (byte 0xff); a TOML file is UTF-8: save it as UTF-8")


def test_server_start_names_the_variable_that_named_a_missing_file(tmp_path: Path) -> None:
    out = cli("server", "start", "--port", "0",
              env=base_env(tmp_path / "home", GPULAYER_PROVIDERS=str(tmp_path / "nope.toml")), timeout=60)
    assert (out.returncode, out.stderr.strip()) == (
        2, f"error: GPULAYER_PROVIDERS='{tmp_path / 'nope.toml'}': no such file")
