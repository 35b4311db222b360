"""The process-wide client: one per setting, and a change of settings never pulls the
control plane out from under job handles that still use the old one."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, Placement


def test_connect_gives_one_client_per_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "a"))
    first = client_mod.connect()
    assert client_mod.connect() is first and first.embedded and first.location == "embedded"
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "b"))
    assert client_mod.connect() is not first


def test_a_handle_outlives_a_switch_to_other_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "a"))
    wait = Placement(on_unschedulable="wait", target="remote")  # no worker: it stays queued
    h = gl.submit(CommandJob(command=["true"], placement=wait))
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "b"))
    other = gl.submit(CommandJob(command=["true"], placement=wait))
    assert h.status() == "queued" and other.status() == "queued"  # the first client still works
    assert h.cancel() == JobState.CANCELLED.value
    assert [j.id for j in client_mod.connect().api.list_jobs()] == [other.id]
