"""Malicious bundles through every path that takes one (issue 13 §7): the library
(:func:`check_archive`, :func:`extract_bundle`), an upload to the server (in-process over
HTTP) and the job that would use it, and ``gpulayer bundle inspect ARCHIVE.zip``. Each is
refused with a clear error, nothing is written outside the extraction folder, and memory
stays bounded. A real server process and worker: tests/integration/test_bundle_attacks_server.py.
Also: the extracted-bundle cache is evicted by age and size, never under a running task."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer import bundles
from gpulayer.control import ControlPlane
from gpulayer.errors import BundleError
from gpulayer.server.app import create_app
from gpulayer.store import Store
from tests.bundle_attacks import COUNT_LIMIT, ESCAPE_NAME, attacks

NAMES = sorted(attacks(Path("/x")))


@pytest.fixture(autouse=True)
def _count_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", COUNT_LIMIT)


def nothing_escaped(root: Path, absolute: Path) -> bool:
    return not absolute.exists() and not any(p.name == ESCAPE_NAME for p in root.rglob("*"))


def only_locks_or_nothing(cache: Path) -> bool:
    return not cache.exists() or all(p.name.startswith(".") and p.is_file() for p in cache.iterdir())


@pytest.mark.parametrize("name", NAMES)
def test_the_library_refuses_it_before_writing(tmp_path: Path, name: str) -> None:
    absolute = tmp_path / "abs" / ESCAPE_NAME
    make, phrase = attacks(absolute)[name]
    data = make()
    digest = bundles.compute_digest(data)
    with pytest.raises(BundleError, match=phrase):
        bundles.check_archive(data, digest)
    cache = tmp_path / "work" / "cache"
    with pytest.raises(BundleError, match=phrase):
        bundles.extract_bundle(data, digest, cache)
    assert only_locks_or_nothing(cache)
    assert nothing_escaped(tmp_path, absolute)


def test_refusing_a_bomb_takes_little_memory(tmp_path: Path) -> None:
    make, _ = attacks(tmp_path / ESCAPE_NAME)["ratio bomb"]
    data = make()
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match=r"compression ratio of 1\d\d\d:1"):
            bundles.extract_bundle(data, bundles.compute_digest(data), tmp_path / "cache")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(data) < 100_000 and peak < 4 * 1024 * 1024, peak  # 32 MiB declared, never inflated


def test_an_entry_count_is_refused_from_the_end_record_before_the_directory_is_read() -> None:
    data = bytearray(attacks(Path("/x"))["dot-dot"][0]())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, 60_000, 60_000)  # claims 60,000 entries
    with pytest.raises(BundleError, match="60000 entries, more than the 1000 allowed"):
        bundles.check_archive(bytes(data))


def test_an_end_record_that_understates_the_entries_does_not_get_them_read() -> None:
    # zipfile reads every record of the central directory whatever the end record says:
    # one that claims 1 entry must not get 20,000 records held in memory to be counted
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(20_000):
            zf.writestr(zipfile.ZipInfo(f"f{i}", date_time=(1980, 1, 1, 0, 0, 0)), b"")
    data = bytearray(buf.getvalue())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, 1, 1)  # claims 1 entry
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="more than 1000 entries"):
            bundles.check_archive(bytes(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak  # (20,000 records read: about 10 MB)


def test_the_limits_are_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = attacks(Path("/x"))["ratio bomb"][0]()
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_RATIO", "5000")
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_UNPACKED_MB", "16")
    with pytest.raises(BundleError, match="GPULAYER_MAX_BUNDLE_UNPACKED_MB"):
        bundles.check_archive(data)
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_UNPACKED_MB", "64")
    assert bundles.check_archive(data) == ["zeros.bin"]


def test_building_a_bundle_that_receivers_would_refuse_fails_first(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "main.py").write_text("print(1)\n")
    with open(proj / "zeros.bin", "wb") as f:
        f.write(bytes(8 << 20))
    with pytest.raises(BundleError, match=r"source bundle of .*proj would be refused: bundle entry 'zeros.bin' "
                                          r"would extract 8.0 MB .*GPULAYER_MAX_BUNDLE_RATIO.*\.gpulayerignore"):
        bundles.build_bundle(proj)
    (proj / ".gpulayerignore").write_text("*.bin\n")
    assert [f.path for f in bundles.build_bundle(proj).files] == [".gpulayerignore", "main.py"]


def test_a_bundle_its_files_sizes_say_would_be_refused_is_refused_before_a_file_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a 3 GB file of zeros was read and compressed (17 s) before the receivers' limit on what
    # a bundle extracts to refused it, without naming it; its size says so at once
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_UNPACKED_MB", "1")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "main.py").write_text("print(1)\n")
    (proj / "data.bin").write_bytes(os.urandom(2 << 20))
    inspection = bundles.inspect_directory(proj)
    (proj / "data.bin").unlink()  # (a read of it would fail: "cannot read")
    with pytest.raises(bundles.BundleRefused, match=r"its files come to 2.0 MB \(\d+ bytes\), more than the 1.0 MB a "
                                                    r"bundle may extract to .*largest files: data.bin \(2.0 MB\)"):
        bundles.build_from_inspection(inspection)
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_UNPACKED_MB", "1000")
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "1")
    with pytest.raises(bundles.BundleRefused, match=r"it has 2 files, more than the 1 entries allowed"):
        bundles.build_from_inspection(inspection)


# ---------------------------------------------------------------------------------- the server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc


@pytest.mark.parametrize("name", NAMES)
def test_an_upload_is_refused_and_a_job_cannot_use_it(served: tuple[ControlPlane, TestClient],
                                                      tmp_path: Path, name: str) -> None:
    control, tc = served
    absolute = tmp_path / "abs" / ESCAPE_NAME
    make, phrase = attacks(absolute)[name]
    data = make()
    digest = bundles.compute_digest(data)
    client = {"authorization": f"Bearer {control.create_token(scope='client').token}"}
    r = tc.put(f"/v1/bundles/{digest}", headers=client, content=data)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_bundle" and phrase.strip("'") in r.json()["error"]["message"]
    assert tc.head(f"/v1/bundles/{digest}", headers=client).status_code == 404
    r = tc.post("/v1/jobs", headers=client, json={"spec": {"kind": "command", "command": ["python", "ok.py"],
                                                             "bundle_digest": digest}})
    assert r.status_code == 422 and "no bundle with that address was uploaded" in r.text
    assert control.list_jobs() == []
    assert nothing_escaped(tmp_path, absolute)


# ---------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("name", NAMES)
def test_bundle_inspect_of_the_archive_refuses_it(tmp_path: Path, name: str) -> None:
    absolute = tmp_path / "abs" / ESCAPE_NAME
    make, phrase = attacks(absolute)[name]
    archive = tmp_path / "in" / "attack.zip"
    archive.parent.mkdir()
    archive.write_bytes(make())
    out = subprocess.run([sys.executable, "-m", "gpulayer.cli", "bundle", "inspect", str(archive)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GPULAYER_HOME": str(tmp_path / "home")})
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"error: bundle {str(archive)!r} refused: " in out.stderr and phrase.strip("'") in out.stderr
    assert nothing_escaped(tmp_path, absolute)


def test_bundle_inspect_of_a_good_archive_lists_it(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "main.py").write_text("print(1)\n")
    built = bundles.build_bundle(tmp_path / "proj")
    archive = tmp_path / "b.zip"
    archive.write_bytes(built.data)
    out = subprocess.run([sys.executable, "-m", "gpulayer.cli", "bundle", "inspect", str(archive)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "GPULAYER_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr
    assert "1 files" in out.stdout and "  main.py" in out.stdout and f"sha256:{built.digest}" in out.stdout


# ---------------------------------------------------------------------------------- the cache


def _extracted(cache: Path, text: str) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("main.py", date_time=(1980, 1, 1, 0, 0, 0)), text)
    raw = buf.getvalue()
    digest = bundles.compute_digest(raw)
    bundles.extract_bundle(raw, digest, cache)
    return digest


def test_the_cache_is_evicted_by_age_and_size_but_never_under_a_running_task(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old, held, recent = (_extracted(cache, f"x = {i!r}\n" * 1000) for i in range(3))
    now = time.time()
    os.utime(cache / old, (now - 10 * 86400, now - 10 * 86400))
    os.utime(cache / held, (now - 20 * 86400, now - 20 * 86400))
    with bundles.bundle_in_use(cache, held):
        os.utime(cache / f".{held}.inuse", (now - 20 * 86400, now - 20 * 86400))
        # by age (7 days): the old one goes; the held one is older still, but in use
        assert bundles.evict_cache(cache, max_bytes=10**9, max_age=7 * 86400, now=now) == [old]
        # by size: everything not in use goes, least recently used first
        assert bundles.evict_cache(cache, max_bytes=1, max_age=10**9, now=now) == [recent]
        assert (cache / held / "main.py").is_file()
    assert bundles.evict_cache(cache, max_bytes=1, max_age=10**9, now=now) == [held]
    assert [p for p in cache.iterdir() if not p.name.startswith(".")] == []
    # a bundle evicted is extracted again when a task needs it
    assert _extracted(cache, "x = 0\n" * 1000) == old and (cache / old / "main.py").is_file()


def test_a_bundle_is_measured_again_only_once_a_task_used_it(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that has extracted many bundles does not walk every tree at each new one: a
    size measured while no task held the bundle holds until a task uses it again (only a
    task writes there, and each use is marked)."""
    from gpulayer.bundles import cache as keeping

    cache = tmp_path / "cache"
    first, second = (_extracted(cache, f"x = {i!r}\n" * 1000) for i in range(2))
    hour_ago = time.time() - 3600
    for digest in (first, second):
        with bundles.bundle_in_use(cache, digest):
            pass
        os.utime(cache / f".{digest}.inuse", (hour_ago, hour_ago))
    walked: list[str] = []
    real = keeping._tree_size

    def spy(path: Path) -> int:
        walked.append(path.name)
        return real(path)

    monkeypatch.setattr(keeping, "_tree_size", spy)
    assert bundles.evict_cache(cache, max_bytes=10**9) == []
    assert sorted(walked) == sorted([first, second])
    walked.clear()
    assert bundles.evict_cache(cache, max_bytes=10**9) == []
    assert walked == []  # (neither was used since)
    with bundles.bundle_in_use(cache, first):  # a task writes into its bundle's folder
        (cache / first / "output.bin").write_bytes(b"\0" * 200_000)
        assert bundles.evict_cache(cache, max_bytes=10**9) == []  # (held: measured, not kept)
    walked.clear()
    # (used since: measured again, its output counted, so both go to get under the limit;
    # the other one's size holds)
    assert bundles.evict_cache(cache, max_bytes=150_000) == [second, first]
    assert walked == [first]


def test_what_an_eviction_or_extraction_stopped_midway_left_is_removed_once_old(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    kept = _extracted(cache, "x = 1\n")
    digest = "0" * 64
    stale = [cache / f".{digest}.evict-abc", cache / f".{digest}.tmp-abc"]
    fresh = cache / f".{digest}.evict-new"
    for folder in [*stale, fresh]:
        (folder / "tree").mkdir(parents=True)
        (folder / "tree" / "f").write_text("left")
    for folder in stale:
        os.utime(folder, (time.time() - 7200, time.time() - 7200))
    assert bundles.evict_cache(cache, max_bytes=10**9) == []
    assert not any(f.exists() for f in stale)
    assert fresh.exists() and (cache / kept).is_dir()  # (one going on now is its owner's)


def test_an_eviction_waits_a_moment_for_another_evictors_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's look at whether a task holds a bundle takes its lock for a moment:
    the bundle is not taken to be in use (and a newer one evicted instead)."""
    import fcntl
    import threading

    from gpulayer.bundles import cache as keeping

    monkeypatch.setattr(keeping, "_LOCK_TRIES", 500)  # (up to a second: the look ends in 20 ms)
    cache = tmp_path / "cache"
    old = _extracted(cache, "x = 1\n" * 100)
    new = _extracted(cache, "x = 2\n" * 100)
    fd = os.open(cache / f".{old}.inuse", os.O_RDWR | os.O_CREAT, 0o600)
    os.utime(cache / f".{old}.inuse", (time.time() - 3600, time.time() - 3600))  # (its last use)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (the other evictor's look)
    threading.Timer(0.02, os.close, (fd,)).start()
    size = sum(f.stat().st_size for f in (cache / new).rglob("*") if f.is_file())
    assert bundles.evict_cache(cache, max_bytes=size) == [old]
    assert (cache / new).is_dir()
