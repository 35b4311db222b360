"""``gpulayer submit`` without ``--bundle`` notes a file of the current folder that the
command names: the job runs in a folder of its own, and would not find it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.cli.jobs import unsent_file


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "build").mkdir()  # (output, not a package: `python -m build` imports the installed one)
    (tmp_path / "build" / "out.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("command", "distributed", "named"), [
    (["python", "train.py"], False, "train.py"),
    (["python3.11", "-u", "-X", "dev", "train.py", "--lr", "1"], False, "train.py"),
    (["python", "-m", "pkg.main"], False, "pkg"),
    (["bash", "run.sh"], False, "run.sh"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], False, "train.py"),
    (["./run.sh"], False, "./run.sh"),
    (["train.py"], True, "train.py"),
    (["pkg.main:fn"], True, "pkg"),
    # nothing of this folder, or nothing it could be
    (["python", "-c", "print('train.py')"], False, None),
    (["python", "other.py"], False, None),
    (["python", "-m", "json.tool"], False, None),
    (["echo", "train.py"], False, None),
    (["ls"], False, None),
    (["other.py"], True, None),
    (["python", "-m", "build"], False, None),
    (["python", "../train.py"], False, None),
    (["shuf", "-o", "train.py"], False, None),
    (["sha256sum", "train.py"], False, None),
    (["python", "--check-hash-based-pycs", "default", "train.py"], False, "train.py"),
    (["/usr/bin/python3.11", "train.py"], False, "train.py"),
    (["python", ""], False, None),
    (["python", "-m"], False, None),
])
def test_the_file_a_command_names_here_is_found(here: Path, command: list[str], distributed: bool,
                                                named: str | None) -> None:
    assert unsent_file(command, distributed=distributed) == named


def test_a_module_the_jobs_own_pythonpath_may_find_is_not_noted(here: Path) -> None:
    assert unsent_file(["python", "-m", "pkg"], env={"PYTHONPATH": "/srv/code"}) is None
    assert unsent_file(["python", "train.py"], env={"PYTHONPATH": "/srv/code"}) == "train.py"


def test_an_absolute_path_is_not_noted(here: Path) -> None:
    assert unsent_file(["python", str(here / "train.py")]) is None
