"""Finding and reading providers.toml (gpulayer.provider_config.load): how the user named the
file is how an error names it; a file that is not UTF-8 is an error naming it, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.errors import InvalidInput
from gpulayer.provider_config import load
from tests.server_support import base_env
from tests.support import cli

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
