"""Artifacts in parts: what a worker packs of a task's folder (and leaves out, or refuses),
what it says when the control plane does not store them, what the control plane accepts
(on SQLite and PostgreSQL), and how a reader extracts them. End to end:
tests/integration/test_artifacts.py."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import shutil
import threading
import tracemalloc
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpulayer import artifacts
from gpulayer.api import TaskAssignment
from gpulayer.bundles.archive import check_archive, extract_into
from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.control import artifacts as control_artifacts
from gpulayer.errors import (
    BundleError,
    ConnectionFailed,
    DatabaseFailed,
    Forbidden,
    InvalidInput,
    NotFound,
    TooLarge,
)
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import plain
from gpulayer.wire import TaskArtifacts
from gpulayer.worker.artifacts import Refused, keep, pack
from gpulayer.worker.task_files import TaskFiles
from tests.bundle_attacks import make_zip
from tests.factories import make_capabilities, running_task


def _zip(files: dict[str, bytes]) -> tuple[bytes, str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the worker's side


def test_pack_keeps_regular_files_by_path_and_leaves_out_the_rest(tmp_path: Path) -> None:
    assert pack(tmp_path / "missing") is None
    folder = tmp_path / "a"
    folder.mkdir()
    assert pack(folder) is None  # (nothing left: nothing to store)
    (folder / "z.txt").write_text("z")
    (folder / "d" / "e").mkdir(parents=True)
    (folder / "d" / "e" / "deep.bin").write_bytes(b"\0" * 100)
    (folder / "d" / "empty").mkdir()
    os.symlink(tmp_path, folder / "d" / "dirlink")
    os.symlink("/etc/hostname", folder / "filelink")
    os.mkfifo(folder / "pipe")
    got = pack(folder)
    assert got is not None
    assert got.files == 2 and got.unpacked == 101 and got.digest == hashlib.sha256(got.data).hexdigest()
    assert got.left_out == ["d/dirlink", "filelink", "pipe"]
    with zipfile.ZipFile(io.BytesIO(got.data)) as zf:
        assert zf.namelist() == ["d/e/deep.bin", "z.txt"]
        assert zf.read("d/e/deep.bin") == b"\0" * 100
    only_links = tmp_path / "b"
    only_links.mkdir()
    os.symlink("/etc/hostname", only_links / "l")
    lonely = pack(only_links)
    assert lonely is not None and lonely.files == 0 and lonely.left_out == ["l"]


def test_pack_stores_a_large_file_that_does_not_compress_and_deflates_the_rest(tmp_path: Path) -> None:
    (tmp_path / "ckpt.bin").write_bytes(os.urandom(200_000))
    (tmp_path / "log.txt").write_text("epoch 1 loss 0.25\n" * 10_000)
    (tmp_path / "small.bin").write_bytes(os.urandom(1000))
    got = pack(tmp_path)
    assert got is not None
    with zipfile.ZipFile(io.BytesIO(got.data)) as zf:
        how = {i.filename: i.compress_type for i in zf.infolist()}
        assert zf.read("ckpt.bin") == (tmp_path / "ckpt.bin").read_bytes()
    assert how == {"ckpt.bin": zipfile.ZIP_STORED, "log.txt": zipfile.ZIP_DEFLATED, "small.bin": zipfile.ZIP_DEFLATED}


def test_pack_refuses_more_than_the_control_plane_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "a"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}").write_bytes(os.urandom(40_000))
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "2")
    with pytest.raises(Refused, match=r"^3 files, more than the 2 allowed \(GPULAYER_MAX_BUNDLE_FILES\)$"):
        pack(folder)
    monkeypatch.delenv("GPULAYER_MAX_BUNDLE_FILES")
    monkeypatch.setenv("GPULAYER_MAX_ARTIFACTS_MB", "0.05")  # 52,428 bytes: 120,000 random ones do not fit
    with pytest.raises(Refused, match=r"^artifacts are over the control plane's limit: the limit is 51.2 KB "
                                      r"\(52428 bytes, GPULAYER_MAX_ARTIFACTS_MB\)$"):
        pack(folder)


class _Api:
    """A worker's control plane that answers put_artifacts with ``answer`` (raised)."""

    url = "https://cp.example:8765"

    def __init__(self, answer: Exception | None = None) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, bytes, str]] = []

    def put_artifacts(self, task_id: str, digest: str, data: bytes, *, worker_id: str) -> None:
        self.sent.append((task_id, digest, data, worker_id))
        if self.answer is not None:
            raise self.answer


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def add(self, stream: str, text: str) -> None:
        self.lines.append((stream, text))


def _assignment() -> TaskAssignment:
    return TaskAssignment(task_id="tsk-1", job_id="job-1", attempt=1, node_rank=0, accelerator=None, devices=[],
                          spec=CommandJob(command=["true"]))


@pytest.mark.parametrize(("answer", "said"), [
    (None, []),
    (NotFound("PUT /v1/tasks/tsk-1/artifacts/ab: no such route"),  # (a server from before them)
     ["gpulayer: artifacts not kept (1 file(s), 5 B): the control plane at https://cp.example:8765 keeps no "
      "artifacts: its server is older than artifacts; upgrade it\n"]),
    (NotFound("task 'tsk-1': no such task"),
     ["gpulayer: artifacts not kept (1 file(s), 5 B): task 'tsk-1': no such task\n"]),
    (TooLarge("artifacts are over the control plane's limit: the limit is 1.0 MB"),
     ["gpulayer: artifacts not kept (1 file(s), 5 B): artifacts are over the control plane's limit: the limit is 1.0 MB\n"]),
])
def test_keep_sends_them_or_says_in_the_output_why_not(tmp_path: Path, answer: Exception | None,
                                                         said: list[str]) -> None:
    (tmp_path / "out.txt").write_text("hello")
    api, log = _Api(answer), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    [(task_id, digest, data, worker)] = api.sent
    assert (task_id, worker) == ("tsk-1", "wkr-1") and digest == hashlib.sha256(data).hexdigest()
    assert [text for _, text in log.lines] == said and all(stream == "stderr" for stream, _ in log.lines)


def test_keep_sends_them_again_through_an_outage_as_the_report_is(tmp_path: Path) -> None:
    # (the report of the task's end is retried for minutes: artifacts given up on after the
    # HTTP client's own 30 s were missing from a job that ended as a server restarted)
    (tmp_path / "out.txt").write_text("hello")

    class Away(_Api):
        def put_artifacts(self, task_id: str, digest: str, data: bytes, *, worker_id: str) -> None:
            super().put_artifacts(task_id, digest, data, worker_id=worker_id)
            if len(self.sent) == 1:
                raise ConnectionFailed("cannot reach the control plane at http://127.0.0.1:1: ConnectError")
            if len(self.sent) == 2:
                raise DatabaseFailed("the control plane's database failed: disk full")

    api, log = Away(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    assert len(api.sent) == 3 and log.lines == []
    api, log = Away(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log, retry_for=0)  # type: ignore[arg-type]
    assert len(api.sent) == 1
    assert log.lines == [("stderr", "gpulayer: artifacts not kept (1 file(s), 5 B): cannot reach the control plane "
                                    "at http://127.0.0.1:1: ConnectError\n")]


def test_keep_sends_nothing_for_nothing_and_says_what_it_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    api, log = _Api(), _Log()
    folder = tmp_path / "a.artifacts"
    for nothing in (None, tmp_path / "never-made", folder):
        folder.mkdir(exist_ok=True)
        keep(api, _assignment(), "wkr-1", nothing, log)  # type: ignore[arg-type]
    assert api.sent == [] and log.lines == [] and not folder.exists()  # (an empty one is removed at once)
    folder.mkdir()
    (folder / "a").write_bytes(b"1")
    (folder / "b").write_bytes(b"2")
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "1")
    keep(api, _assignment(), "wkr-1", folder, log)  # type: ignore[arg-type]
    assert api.sent == []
    assert log.lines == [("stderr", "gpulayer: artifacts not kept: 2 files, more than the 1 allowed "
                                    "(GPULAYER_MAX_BUNDLE_FILES)\n")]


def test_a_tasks_folders_are_made_empty_and_removed_whatever_they_hold(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    files = TaskFiles()
    assert files.artifacts_made("tsk-1") is None  # (none made: nothing to keep)
    folder, scratch = files.artifacts("tsk-1"), files.scratch("tsk-1")
    assert folder == files.artifacts_made("tsk-1") and folder.is_dir() and list(folder.iterdir()) == []
    (folder / "d").mkdir()
    (folder / "d" / "f").write_text("x")
    files.remove("tsk-1", function=False)
    assert not folder.exists() and not scratch.exists()
    shutil.rmtree(folder.parent)  # (its root removed under it: made again)
    again = files.artifacts("tsk-2")
    assert again.is_dir() and again.parent != folder.parent
    # a stop: what a task still at its end has is left to it, the rest removed
    ending, spec = files.artifacts("tsk-3"), files.paths("tsk-3")[0]
    spec.write_text("{}")
    (ending / "ckpt").write_text("x")
    files.close(["tsk-3"])
    assert not again.exists() and not files.paths("tsk-2")[0].exists()
    assert (ending / "ckpt").read_text() == "x" and spec.exists()
    files.remove("tsk-3", function=True)
    assert not ending.exists() and not spec.exists()
    files.close()
    assert not again.parent.exists()


def _after_listing(monkeypatch: pytest.MonkeyPatch, folder: Path, then: Any) -> None:
    """Run ``then()`` once, as ``folder`` has just been listed (a task's process still at work)."""
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        entries = list(real(path))
        if os.fspath(path) == os.fspath(folder):
            then()
        return _Listing(entries)

    monkeypatch.setattr(os, "scandir", scandir)


class _Listing:
    """What os.scandir answers: an iterator of entries, and a context manager."""

    def __init__(self, entries: list[Any]) -> None:
        self._it = iter(entries)

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_file_removed_while_they_are_packed_costs_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gone.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "kept.txt").write_text("kept")
    (tmp_path / "z.txt").write_text("z")
    # one gone right after the listing that names it, one after its size was read
    _after_listing(monkeypatch, tmp_path, lambda: (tmp_path / "gone.txt").unlink())
    got = pack(tmp_path)
    assert got is not None and (got.files, got.left_out, got.unreadable) == (2, [], [])
    monkeypatch.undo()
    (tmp_path / "gone.txt").write_text("x")
    _after_listing(monkeypatch, tmp_path / "sub", lambda: (tmp_path / "z.txt").unlink())
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    [(_, _, data, _)] = api.sent
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == ["gone.txt", "sub/kept.txt"]
    assert log.lines == []


def test_what_cannot_be_read_is_left_out_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ok.txt").write_text("ok")
    (tmp_path / "secret.txt").write_text("s")
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "in.txt").write_text("in")
    # (as root, mode 000 is no refusal: the refusals are made here)
    real_scandir, real_open = os.scandir, os.open

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) == str(tmp_path / "closed"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(tmp_path / "secret.txt"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "open", open_)
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    [(_, _, data, _)] = api.sent
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.namelist() == ["ok.txt"]
    assert log.lines == [("stderr", "gpulayer: artifacts: left out closed/, secret.txt (they cannot be read)\n")]


def _failing_after(monkeypatch: pytest.MonkeyPatch, path: Path, good: int) -> None:
    """Reads of the file at ``path`` fail with an I/O error once ``good`` bytes have been read
    (a disk's bad block, a network file system's file gone stale): the system call, os.read,
    is the one thing replaced, as no file a test can make fails partway on its own."""
    ino, given = path.stat().st_ino, [0]
    real = os.read

    def read(fd: int, n: int) -> bytes:
        if os.fstat(fd).st_ino != ino:
            return real(fd, n)
        if given[0] >= good:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        chunk = real(fd, min(n, good - given[0]))
        given[0] += len(chunk)
        return chunk

    monkeypatch.setattr(os, "read", read)


@pytest.mark.parametrize(("failing", "data", "good"), [
    ("ckpt.bin", os.urandom(3 * 2**20), 2**20 + 5),  # stored, between two kept: partway, in its second megabyte
    ("z.log", b"step 1 loss 0.25\n" * 200_000, 2**20),  # deflated, the last one written
    ("empty-read.txt", b"x" * 10, 0),  # its first read fails: its entry begun, nothing in it
])
def test_a_file_whose_read_fails_partway_costs_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           failing: str, data: bytes, good: int) -> None:
    # (its entry, half written, lost the whole zip: "artifacts not kept: Input/output error")
    (tmp_path / "a.txt").write_text("kept")
    (tmp_path / "b.bin").write_bytes(os.urandom(200_000))
    (tmp_path / failing).write_bytes(data)
    (tmp_path / "y.txt").write_text("kept too")
    _failing_after(monkeypatch, tmp_path / failing, good)
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    assert log.lines == [("stderr", f"gpulayer: artifacts: left out {failing} (reading them failed: "
                                    "Input/output error)\n")]
    [(_, digest, zipped, _)] = api.sent
    assert check_archive(zipped, digest, limits=artifacts.limits()) == ["a.txt", "b.bin", "y.txt"]
    with zipfile.ZipFile(io.BytesIO(zipped)) as zf:
        assert zf.testzip() is None
        assert zf.read("b.bin") == (tmp_path / "b.bin").read_bytes() and zf.read("y.txt") == b"kept too"
    got = pack(tmp_path)
    assert got is not None and (got.files, got.unpacked) == (3, 4 + 200_000 + 8)
    assert got.failed == [(failing, "Input/output error")] and got.unreadable == []
    monkeypatch.undo()
    (tmp_path / failing).unlink()
    without = pack(tmp_path)  # (the same zip, byte for byte, as if the file had never been there)
    assert without is not None and without.data == zipped


def test_a_file_whose_read_fails_alone_leaves_nothing_to_send_but_says_so(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "only.bin").write_bytes(os.urandom(3 * 2**20))
    _failing_after(monkeypatch, tmp_path / "only.bin", 2**20)
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    assert api.sent == []
    assert log.lines == [("stderr", "gpulayer: artifacts: left out only.bin (reading them failed: "
                                    "Input/output error)\n")]


def test_a_link_swapped_in_after_the_look_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "worker-secret"
    secret.write_text("the worker's own")
    folder = tmp_path / "a"
    (folder / "sub").mkdir(parents=True)
    (folder / "f.txt").write_text("mine")

    def swap() -> None:
        (folder / "f.txt").unlink()
        os.symlink(secret, folder / "f.txt")

    _after_listing(monkeypatch, folder / "sub", swap)  # (f.txt was seen a regular file)
    got = pack(folder)
    assert got is not None and got.files == 0 and got.left_out == ["f.txt"] and got.data == b""


def test_names_the_control_plane_refuses_are_left_out_not_the_rest(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("ok")
    (tmp_path / "a\\b.txt").write_text("x")
    (tmp_path / "c:notes").write_text("x")
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    [(_, digest, data, _)] = api.sent
    assert check_archive(data, digest, limits=artifacts.limits()) == ["ok.txt"]
    [(stream, text)] = log.lines
    assert stream == "stderr" and text == ("gpulayer: artifacts: left out a\\b.txt, c:notes (names a zip does not keep: "
                                           "a backslash, a drive letter, too deep, not UTF-8 with its %XX name taken)\n")


def test_a_name_that_is_not_utf8_is_kept_escaped_and_said(tmp_path: Path) -> None:
    # (a zip holds only UTF-8 names: one in latin-1 was left out, its file lost with it)
    base = os.fsencode(tmp_path)
    made = {b"caf\xe9.txt": b"latin-1", b"100%\xff": b"a percent sign too", b"d\xe9j\xe0/in.txt": b"in a folder",
            b"x%E9": b"a name of its own", b"x\xe9": b"its escape is x%E9, taken"}
    for name, data in made.items():
        path = os.path.join(base, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    os.symlink("/etc/hostname", os.path.join(base, b"l\xe9"))
    api, log = _Api(), _Log()  # (the task's output has U+FFFD for each lone surrogate: LogBuffer.add)
    keep(api, _assignment(), "wkr-1", tmp_path, log)  # type: ignore[arg-type]
    [(_, digest, data, _)] = api.sent
    names = check_archive(data, digest, limits=artifacts.limits())
    assert names == ["100%25%FF", "caf%E9.txt", "d%E9j%E0/in.txt", "x%E9"]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:  # (each name's bytes come back from it as from a URL)
        assert {urllib.parse.unquote_to_bytes(n) if n != "x%E9" else n.encode(): zf.read(n) for n in names} == {
            name: made[name] for name in (b"100%\xff", b"caf\xe9.txt", b"d\xe9j\xe0/in.txt", b"x%E9")}
    assert [text for _, text in log.lines] == [
        "gpulayer: artifacts: left out l%E9 (only regular files are kept, not links or devices)\n",
        "gpulayer: artifacts: left out x\udce9 (names a zip does not keep: a backslash, a drive letter, too deep, "
        "not UTF-8 with its %XX name taken)\n",
        "gpulayer: artifacts: kept 100%\udcff as 100%25%FF, caf\udce9.txt as caf%E9.txt, d\udce9j\udce0/ as d%E9j%E0/ "
        "(names that are not UTF-8, which a zip cannot hold: each byte that is not, and each %, written %XX)\n"]


def test_a_file_dated_beyond_what_a_zip_or_the_clock_can_say_is_kept(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # (tmpfs keeps a modification time of 1e18 s; the local time of it is an OSError, which
    # lost every file the task left)
    (tmp_path / "future.txt").write_text("f")
    (tmp_path / "past.txt").write_text("p")
    dated = {(tmp_path / "future.txt").stat().st_ino: 1e18, (tmp_path / "past.txt").stat().st_ino: -1e18}
    real_stat, real_fstat = os.stat, os.fstat

    def redated(st: os.stat_result) -> os.stat_result:
        if st.st_ino not in dated:
            return st
        when = dated[st.st_ino]
        return os.stat_result((*st[:8], int(when), int(st.st_ctime)),
                              {"st_atime": st.st_atime, "st_mtime": when, "st_ctime": st.st_ctime})

    monkeypatch.setattr(os, "stat", lambda *a, **k: redated(real_stat(*a, **k)))
    monkeypatch.setattr(os, "fstat", lambda fd: redated(real_fstat(fd)))
    got = pack(tmp_path)
    assert got is not None and got.files == 2
    with zipfile.ZipFile(io.BytesIO(got.data)) as zf:
        assert {i.filename: i.date_time for i in zf.infolist()} == {"future.txt": (2107, 12, 31, 23, 59, 58),
                                                                    "past.txt": (1980, 1, 1, 0, 0, 0)}


def test_the_zip_is_refused_as_it_grows_past_the_limit_not_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 MB that do not compress, under the files' own limit (1,000 MB by default) but over
    # the zip's: refused having held about 1 MB, not all 8
    (tmp_path / "big.bin").write_bytes(os.urandom(8 * 2**20))
    monkeypatch.setenv("GPULAYER_MAX_ARTIFACTS_MB", "1")
    tracemalloc.start()
    try:
        with pytest.raises(Refused, match="over the control plane's limit"):
            pack(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


# --------------------------------------------------------------------------- the control plane's side


def test_a_worker_stores_its_tasks_artifacts_once_and_readers_get_them(cp: ControlPlane) -> None:
    job_id, task_id, w = running_task(cp)
    data, digest = _zip({"a.txt": b"one", "d/b.txt": b"two!"})
    stored = cp.put_artifacts(task_id, digest, data, worker_id=w)
    assert (stored.job_id, stored.files, stored.unpacked, stored.size) == (job_id, 2, 7, len(data))
    again, digest2 = _zip({"c.txt": b"three"})  # (its answer lost: sent again, it replaces the first)
    cp.put_artifacts(task_id, digest2, again, worker_id=w)
    [listed] = cp.list_artifacts(job_id)
    assert (listed.task_id, listed.digest, listed.files) == (task_id, digest2, 1)
    assert cp.get_artifacts(job_id, task_id) == again
    assert any(e.kind == "artifacts_stored" and e.message == "1 file(s), 5 B" for e in cp.events(job_id))
    cp.finish_task(task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert cp.get_job(job_id).state is JobState.SUCCEEDED
    with pytest.raises(NotFound, match=r"no artifacts stored"):
        cp.get_artifacts(job_id, "tsk-000000000000")
    with pytest.raises(NotFound, match="no such job"):
        cp.list_artifacts("job-000000000000")

    cp.delete_jobs([job_id])  # (deleted with their job)
    with cp.store.read() as s:
        assert plain.fetch(s, "SELECT COUNT(*) FROM gl_artifacts", ())[0][0] == 0


def test_the_control_plane_refuses_what_is_not_a_tasks_safe_zip(cp: ControlPlane,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, task_id, w = running_task(cp)
    data, digest = _zip({"a.txt": b"one"})
    other = cp.register_worker(make_capabilities(), cpu_slots=1).id
    with pytest.raises(Forbidden, match=f"task {task_id} is not assigned to worker {other}"):
        cp.put_artifacts(task_id, digest, data, worker_id=other)
    with pytest.raises(BundleError, match="does not match"):
        cp.put_artifacts(task_id, "0" * 64, data, worker_id=w)
    escape = make_zip([("../evil.txt", b"x", 0o644)])
    with pytest.raises(BundleError, match=r"\.\."):
        cp.put_artifacts(task_id, hashlib.sha256(escape).hexdigest(), escape, worker_id=w)
    with pytest.raises(NotFound):
        cp.put_artifacts("tsk-000000000000", digest, data, worker_id=w)
    monkeypatch.setenv("GPULAYER_MAX_ARTIFACTS_MB", "0.0001")
    with pytest.raises(TooLarge, match=r"^artifacts are over the control plane's limit: 111 B zipped; the limit is "
                                       r"104 B \(104 bytes, GPULAYER_MAX_ARTIFACTS_MB\)$"):
        cp.put_artifacts(task_id, digest, data, worker_id=w)
    assert cp.list_artifacts(job_id) == []  # (nothing stored by any of them)


def test_a_job_deleted_while_its_tasks_artifacts_are_stored_leaves_none_behind(cp: ControlPlane,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # its worker went silent (a suspended machine): the task is lost and the job failed, and
    # the worker, back, stores what the task left as it ends; a delete of the ended job
    # meanwhile takes them too (on PostgreSQL the upload takes no writers' lock: the delete
    # went by between its look at the task and its insert, leaving a row no delete or prune
    # would find again)
    job_id, task_id, w = running_task(cp)
    cp.clock.now += 11  # type: ignore[attr-defined]
    cp.expire_workers()
    assert cp.get_job(job_id).state is JobState.FAILED
    data, digest = _zip({"a.txt": b"one"})
    inside, go = threading.Event(), threading.Event()
    real_put = control_artifacts.rows.put

    def put(s: Any, row: Any) -> None:
        inside.set()
        go.wait(30)
        real_put(s, row)

    monkeypatch.setattr(control_artifacts.rows, "put", put)
    answers: list[object] = []

    def upload() -> None:
        try:
            answers.append(cp.put_artifacts(task_id, digest, data, worker_id=w))
        except NotFound as exc:
            answers.append(exc)

    uploading = threading.Thread(target=upload)
    uploading.start()
    assert inside.wait(30)
    deleting = threading.Thread(target=cp.delete_jobs, args=([job_id],))
    deleting.start()
    deleting.join(2)  # (it waits for the upload's end, or it is done: either way, the upload goes on)
    go.set()
    uploading.join(30)
    deleting.join(30)
    assert len(answers) == 1
    with cp.store.read() as s:
        assert plain.fetch(s, "SELECT COUNT(*) FROM gl_artifacts", ())[0][0] == 0


# --------------------------------------------------------------------------- the reader's side


def test_extract_into_refuses_to_replace_a_file(tmp_path: Path) -> None:
    data, digest = _zip({"a.txt": b"new", "d/b.txt": b"b"})
    (tmp_path / "a.txt").write_text("mine")
    with pytest.raises(BundleError, match="collides"):
        extract_into(data, digest, tmp_path, limits=artifacts.limits())
    assert (tmp_path / "a.txt").read_text() == "mine"
    (tmp_path / "fresh").mkdir()
    assert extract_into(data, digest, tmp_path / "fresh", limits=artifacts.limits()) == ["a.txt", "d/b.txt"]
    assert (tmp_path / "fresh" / "d" / "b.txt").read_bytes() == b"b"


@pytest.mark.parametrize(("where", "give"), [("--to", "--to DIR"), ("to", "to=...")])
def test_the_default_folder_is_named_as_the_default_not_as_what_was_not_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, give: str) -> None:
    class Api:
        def list_artifacts(self, job_id: str) -> list[TaskArtifacts]:
            return [TaskArtifacts(task_id="tsk-1", job_id=job_id, attempt=1, node_rank=0, digest="0" * 64, size=1,
                                  unpacked=1, files=1, created_at=0.0)]

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "mine.txt").write_text("keep me")
    with pytest.raises(InvalidInput, match=rf"^job-1 \(the folder by default; give {re.escape(give)} for another\): "
                                           r"is not empty; artifacts go into a new or empty folder$"):
        artifacts.download(Api(), "job-1", None, where=where)  # type: ignore[arg-type]


@pytest.mark.parametrize("empty_before", [False, True])
def test_a_download_cut_short_leaves_the_folder_as_it_was_so_that_it_may_be_tried_again(
        tmp_path: Path, empty_before: bool) -> None:
    # (node 0's files extracted, node 1's lost to an outage, exit 69 "try again": the try
    # again was refused, the folder "not empty")
    zips = {"tsk-0": _zip({"a.txt": b"zero"}), "tsk-1": _zip({"b.txt": b"one"})}

    class Api:
        outage = True

        def list_artifacts(self, job_id: str) -> list[TaskArtifacts]:
            return [TaskArtifacts(task_id=f"tsk-{r}", job_id=job_id, attempt=1, node_rank=r, digest=zips[f"tsk-{r}"][1],
                                  size=1, unpacked=4, files=1, created_at=0.0) for r in (0, 1)]

        def get_artifacts(self, job_id: str, task_id: str) -> bytes:
            if task_id == "tsk-1" and self.outage:
                self.outage = False
                raise ConnectionFailed("cannot reach the control plane at http://127.0.0.1:1: ReadError")
            return zips[task_id][0]

    api, to = Api(), tmp_path / "out"
    if empty_before:
        to.mkdir()
    with pytest.raises(ConnectionFailed):
        artifacts.download(api, "job-1", to, nodes=2)  # type: ignore[arg-type]
    assert (list(to.iterdir()) == []) if empty_before else not to.exists()
    got = artifacts.download(api, "job-1", to, nodes=2)  # type: ignore[arg-type]
    assert got.files == ["node-0/a.txt", "node-1/b.txt"] and (to / "node-1" / "b.txt").read_bytes() == b"one"


def test_a_reader_of_an_older_server_is_told_so(tmp_path: Path) -> None:
    class OldServer:
        def get_job(self, job_id: str, **_: Any) -> Any:
            return type("J", (), {"spec": CommandJob(command=["true"]), "state": JobState.SUCCEEDED})()

        def list_artifacts(self, job_id: str) -> Any:
            raise NotFound(f"GET /v1/jobs/{job_id}/artifacts: no such route")

    client = Client.__new__(Client)
    client.api = OldServer()  # type: ignore[assignment]
    client.location = "https://old.example:8443"  # type: ignore[misc]
    with pytest.raises(InvalidInput, match=r"^the control plane at https://old.example:8443 keeps no artifacts: its "
                                           r"server is older than artifacts; upgrade it$"):
        client.artifacts("job-1", tmp_path / "x")


def test_a_worker_draws_no_progress_bar_as_it_sends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # (a bar is for a user's own upload at a terminal, submit's bundle; a worker's stderr is
    # its log, where its tasks' uploads drew bars, over each other's when tasks ended at once)
    import httpx

    from gpulayer import progress
    from gpulayer.http_client import PROGRESS_BYTES, connect_http

    drawn: list[str] = []

    def upload(data: bytes, description: str) -> Any:
        drawn.append(description)
        yield data

    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    monkeypatch.setattr(progress, "upload", upload)
    data = bytes(PROGRESS_BYTES)
    digest = hashlib.sha256(data).hexdigest()

    def handle(request: httpx.Request) -> httpx.Response:
        request.read()
        if request.url.path.startswith("/v1/bundles/"):
            return httpx.Response(201, json={"digest": digest, "size": len(data), "stored": True})
        return httpx.Response(201, json=TaskArtifacts(task_id="tsk-1", job_id="job-1", attempt=1, node_rank=0,
                                                      digest=digest, size=len(data), unpacked=0, files=0,
                                                      created_at=0.0).model_dump(mode="json"))

    api = connect_http("http://testserver", token="t", retry_for=5, transport=httpx.MockTransport(handle))
    api.put_artifacts("tsk-1", digest, data, worker_id="wkr-1")
    assert drawn == []
    api.put_bundle(digest, data)  # (a client's: drawn)
    assert drawn == [f"upload {digest[:12]}"]


def test_keep_follows_no_link_put_in_the_folders_place(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "key").write_text("not the task's to send")
    folder = tmp_path / "tsk-1.artifacts"
    os.symlink(secret, folder)  # (the task removed its folder and put a link there)
    api, log = _Api(), _Log()
    keep(api, _assignment(), "wkr-1", folder, log)  # type: ignore[arg-type]
    assert api.sent == []
    assert log.lines == [("stderr", "gpulayer: artifacts not kept: $GPULAYER_ARTIFACTS_DIR was replaced by a link "
                                    "(only a folder's regular files are kept)\n")]
