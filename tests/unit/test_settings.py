"""One Settings object: every GPULAYER_* variable parsed in one place, errors naming it, and
one table in docs/settings.md that matches the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulayer import config
from gpulayer.errors import InvalidInput
from tests.support import cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_docs_table_lists_every_setting_with_its_default() -> None:
    rows = re.findall(r"^\| `(GPULAYER_[A-Z_]+)` \| (.*?) \| (.*?) \|$", DOC.read_text(), re.M)
    assert [(n, d, h) for n, d, h in rows] == [(s.name, s.shown, s.help) for s in config.SETTINGS]


def test_defaults_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in config.SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    env = config.settings()
    assert (env.heartbeat_timeout, env.max_bundle_mb, env.rendezvous_ports, env.url) == (10.0, 100.0, (20000, 32767), None)
    monkeypatch.setenv("GPULAYER_HEARTBEAT_TIMEOUT", "2.5")
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", " cuda, ,rocm ")
    monkeypatch.setenv("GPULAYER_URL", "")  # empty is unset
    env = config.settings()
    assert (env.heartbeat_timeout, env.disable_plugins, env.url) == (2.5, ("cuda", "rocm"), None)
    assert env.preload == ()
    monkeypatch.setenv("GPULAYER_PRELOAD", " torch, numpy.linalg,,torch ")  # in order, each once
    assert config.settings().preload == ("torch", "numpy.linalg")



@pytest.mark.parametrize("stored", [True, False], ids=["os.environ's own store", "os.environ.get"])
def test_the_settings_follow_every_change_of_the_environment(monkeypatch: pytest.MonkeyPatch, stored: bool) -> None:
    if not stored:  # (an os.environ that is not CPython's: each variable read by name)
        monkeypatch.setattr(config, "_stored_values", lambda: None)
    else:
        assert config._stored_values() is not None
    monkeypatch.delenv("GPULAYER_CPU_SLOTS", raising=False)
    assert config.settings().cpu_slots is None
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "3")
    assert config.settings().cpu_slots == 3
    first = config.settings()
    assert config.settings() is first  # unchanged: the same, not parsed again
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "5")
    assert config.settings().cpu_slots == 5
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "many")
    with pytest.raises(InvalidInput, match="GPULAYER_CPU_SLOTS"):
        config.settings()
    with pytest.raises(InvalidInput, match="GPULAYER_CPU_SLOTS"):  # not kept as if it were good
        config.settings()
    monkeypatch.delenv("GPULAYER_CPU_SLOTS")
    assert config.settings().cpu_slots is None

@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("GPULAYER_HEARTBEAT_TIMEOUT", "abc", "expected a number of seconds > 0"),
    ("GPULAYER_HEARTBEAT_TIMEOUT", "0", "expected a number of seconds > 0"),
    ("GPULAYER_HEARTBEAT_INTERVAL", "inf", "expected a number of seconds > 0"),
    ("GPULAYER_HTTP_RETRY_SECONDS", "-1", "expected a number of seconds >= 0"),
    ("GPULAYER_MAX_BUNDLE_MB", "nan", "expected a number > 0"),
    ("GPULAYER_MAX_ARTIFACTS_MB", "2000", "expected a number > 0 and at most 900 (a task's artifacts are one value"),
    ("GPULAYER_MAX_ARTIFACTS_MB", "0", "expected a number > 0"),
    ("GPULAYER_CPU_SLOTS", "two", "expected a whole number >= 0"),
    ("GPULAYER_SERVER_THREADS", "0", "expected a whole number >= 1"),
    ("GPULAYER_RENDEZVOUS_PORTS", "80-90", "expected 1024 <= LOW <= HIGH <= 65535"),
    ("GPULAYER_RENDEZVOUS_PORTS", "20000", "expected LOW-HIGH"),
    ("GPULAYER_LOG_LEVEL", "loud", "expected one of DEBUG, INFO"),
    ("GPULAYER_SQLITE_SYNC", "off", "expected one of full, normal"),
    ("GPULAYER_PRELOAD", "torch,1x", "'1x' is not a module name; expected Python module names, comma separated"),
    ("GPULAYER_PRELOAD", "numpy..linalg", "'numpy..linalg' is not a module name"),
    ("GPULAYER_URL", "127.0.0.1:8765", "not http:// or https://; expected http://HOST:PORT or https://HOST:PORT"),
    ("GPULAYER_URL", "http://127.0.0.1:notaport", "Port could not be cast to integer value"),
    ("GPULAYER_URL", "http://[::1:8765", "Invalid IPv6 URL"),
    ("GPULAYER_URL", "http://127.0.0.1:99999", "Port out of range 0-65535"),
    ("GPULAYER_URL", "http://", "no host"),
    ("GPULAYER_URL", "http://u:p@127.0.0.1:8765", "a user name or password in it"),
    ("GPULAYER_URL", "http://127.0.0.1:8765?x=1", "a query or fragment after the address"),
    ("GPULAYER_URL", "https://h:8765/api#top", "a query or fragment after the address"),
    # (it becomes the GPULAYER_URL of the machines providers boot: checked the same)
    ("GPULAYER_PUBLIC_URL", "https://proxy.example/gpulayer?x=1", "a query or fragment after the address"),
    ("GPULAYER_CA", "sha256:zz", "not a SHA-256 fingerprint; expected sha256: and 64 hex digits"),
    ("GPULAYER_CA", "sha256:" + "0" * 62, "not a SHA-256 fingerprint"),
    # (torchrun refused these on every node, after the whole group was placed)
    ("GPULAYER_ADVERTISE_ADDRESS", "not an address", "not an address; expected an IP address"),
    ("GPULAYER_ADVERTISE_ADDRESS", "300.1.1.1", "not an address"),
    ("GPULAYER_ADVERTISE_ADDRESS", "-box", "not an address"),
    ("GPULAYER_OVERRIDE_ADDRESS", "not an ip", "not an address"),  # (resources.toml's address refused it)
])
def test_a_bad_value_names_the_variable_and_what_is_accepted(monkeypatch: pytest.MonkeyPatch, name: str,
                                                              value: str, accepted: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput) as e:
        config.settings()
    assert str(e.value).startswith(f"{name}={value!r}: {accepted}")


def test_the_cli_exits_2_with_the_variable_named(tmp_path: Path) -> None:
    r = cli("jobs", "list", env={"GPULAYER_HOME": str(tmp_path), "GPULAYER_HEARTBEAT_TIMEOUT": "abc"})
    assert r.returncode == 2
    assert "error: GPULAYER_HEARTBEAT_TIMEOUT='abc': expected a number of seconds > 0" in r.stderr
    assert "Traceback" not in r.stderr


def test_good_addresses_tokens_and_pins_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for address in ("10.0.0.5", "fd00::5", "gpu-box", "gpu-box.example.com"):
        monkeypatch.setenv("GPULAYER_ADVERTISE_ADDRESS", address)
        assert config.settings().advertise_address == address
    pin = "sha256:" + ":".join(["Ab"] * 32)
    for url in ("http://127.0.0.1:8765", "https://gpu-box:8765/", "http://[::1]:8765", "https://h",
                "https://proxy.example/gpulayer"):  # (a proxy's path: the API's paths follow it)
        monkeypatch.setenv("GPULAYER_URL", url)
        monkeypatch.setenv("GPULAYER_TOKEN", "glt_g0o3MMvPSNZ1TSR315tIpHMZufZlNwCR-x_y")
        monkeypatch.setenv("GPULAYER_CA", pin)
        assert (config.settings().url, config.settings().ca) == (url, pin)


@pytest.mark.parametrize(("flags", "says"), [
    (["--url", "http://127.0.0.1:notaport"], "error: --url='http://127.0.0.1:notaport': Port could not be cast"),
    (["--url", "https://127.0.0.1:1", "--ca", "sha256:00:11"], "error: --ca='sha256:00:11': not a SHA-256 fingerprint"),
    (["--url", "http://127.0.0.1:1", "--token", "glt_\u00e9"], "error: --token: not an API token (it holds a space, a "
                                                             "control character or a character that is not ASCII)"),
    (["--url", "http://127.0.0.1:1", "--token", "glt_\x01"], "error: --token: not an API token"),
])
def test_the_connection_flags_are_refused_naming_the_flag(tmp_path: Path, flags: list[str], says: str) -> None:
    """A bad --url ended in httpx's InvalidURL traceback, a non-ASCII token in a UnicodeEncodeError."""
    r = cli(*flags, "jobs", "list", env={"GPULAYER_HOME": str(tmp_path)})
    assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
    assert r.stderr.startswith(says), r.stderr
    assert "glt_\\" not in r.stderr and "glt_\u00e9" not in r.stderr  # (a token is not echoed, even a bad one)


def test_a_ca_file_that_holds_no_certificate_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """A --ca file that is not PEM (a key, a token, the wrong file) was an ssl.SSLError traceback, exit 1."""
    wrong = tmp_path / "token.txt"
    wrong.write_text("glt_not-a-certificate\n")
    r = cli("--url", "https://127.0.0.1:1", "--ca", str(wrong), "jobs", "list",
            env={"GPULAYER_HOME": str(tmp_path / "home"), "GPULAYER_WARM_CLI": "0"})
    assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
    assert r.stderr.startswith(f"error: --ca / GPULAYER_CA '{wrong}': not a CA bundle or certificate "), r.stderr
    assert "accepted: a PEM file of certificates" in r.stderr


def test_worker_start_refuses_a_bad_preload_naming_the_flag(tmp_path: Path) -> None:
    r = cli("worker", "start", "--preload", "torch", "--preload", "numpy, 2d", env={"GPULAYER_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: --preload 'torch,numpy, 2d': '2d' is not a module name; expected Python "
                                "module names, comma separated (torch,numpy.linalg)")


def test_a_home_that_cannot_be_a_folder_is_refused_naming_the_variable(tmp_path: Path) -> None:
    """A file named by GPULAYER_HOME was a FileExistsError traceback, exit 1."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for words in (["jobs", "list"], ["resources", "detect"]):
        r = cli(*words, env={"GPULAYER_HOME": str(afile), "GPULAYER_WARM_CLI": "0"})
        assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
        assert f"error: GPULAYER_HOME='{afile}': cannot be the state directory: File exists" in r.stderr


def test_a_home_flag_that_cannot_be_a_folder_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """--home named a file: the error named GPULAYER_HOME, which the user had not set."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for words in (["jobs", "list"], ["submit", "--", "true"]):
        r = cli("--home", str(afile), *words, env={"GPULAYER_HOME": str(tmp_path / "home"), "GPULAYER_WARM_CLI": "0"})
        assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
        assert r.stderr.startswith(f"error: --home '{afile}': cannot be the state directory: File exists"), r.stderr
