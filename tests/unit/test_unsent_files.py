"""A job that sends no bundle and names a file of the current folder is told so (``gpulayer
submit`` on stderr, ``gl.submit`` with an :class:`UnsentFileWarning`): the job runs in a
folder of its own, and would not find it."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, Placement
from gpulayer.unsent import UnsentFileWarning, unsent_file, unsent_in_spec


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "build").mkdir()  # (output, not a package: `python -m build` imports the installed one)
    (tmp_path / "build" / "out.txt").write_text("")
    (tmp_path / "mymod.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "json.py").write_text("")  # (a file named like a module this Python has: its own is found)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("command", "distributed", "named"), [
    (["python", "train.py"], False, "train.py"),
    (["python3.11", "-u", "-X", "dev", "train.py", "--lr", "1"], False, "train.py"),
    (["python", "-m", "pkg.main"], False, "pkg"),
    (["python", "-m", "mymod"], False, "mymod.py"),
    (["bash", "run.sh"], False, "run.sh"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], False, "train.py"),
    (["./run.sh"], False, "./run.sh"),
    (["train.py"], True, "train.py"),
    (["pkg.main:fn"], True, "pkg"),
    (["mymod:f"], True, "mymod.py"),
    (["json:dumps"], True, None),
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


def test_a_module_found_elsewhere_too_is_not_noted(here: Path, tmp_path_factory: pytest.TempPathFactory,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed, or in a folder of ``sys.path`` other than this one: the job's Python may
    import it from there. This folder on ``sys.path`` (a script's own) does not count."""
    monkeypatch.syspath_prepend(str(here))
    assert unsent_file(["mymod:f"], distributed=True) == "mymod.py"
    elsewhere = tmp_path_factory.mktemp("site")
    (elsewhere / "mymod.py").write_text("")
    monkeypatch.syspath_prepend(str(elsewhere))
    assert unsent_file(["mymod:f"], distributed=True) is None


def test_each_kind_of_spec_names_what_it_would_not_find(here: Path) -> None:
    assert unsent_in_spec(CommandJob(command=["python", "train.py"])) == "train.py"
    assert unsent_in_spec(DistributedJob(entry="train.py", nproc_per_node=2)) == "train.py"
    assert unsent_in_spec(DistributedJob(entry="pkg.main:fn")) == "pkg"
    assert unsent_in_spec(FunctionJob(function="mymod:f")) == "mymod.py"
    assert unsent_in_spec(FunctionJob(function="pkg.main:fn", env={"PYTHONPATH": "/srv"})) is None
    for sent in (CommandJob(command=["python", "train.py"], bundle="."),
                 FunctionJob(function="mymod:f", bundle_digest="0" * 64)):
        assert unsent_in_spec(sent) is None


def test_the_sdk_warns_at_the_users_line(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gl.submit`` and ``gl.submit_many`` warn, pointing at the caller's line, and submit
    all the same; with the bundle, no warning."""
    monkeypatch.setenv("GPULAYER_HOME", str(here / ".home"))
    wait = Placement(on_unschedulable="wait", target="remote")  # (no worker: it stays queued)
    with pytest.warns(UnsentFileWarning) as caught:
        handle = gl.submit(CommandJob(command=["python", "train.py"], placement=wait))
        handles = gl.submit_many([FunctionJob(function="mymod:f", placement=wait)])
    assert [str(w.message) for w in caught] == [
        "gl.submit: train.py is in this folder, and the job will not find it: a job runs in a folder of its own, "
        "with only the files bundle=DIR sends (bundle='.' sends this one)",
        "gl.submit_many: mymod.py is in this folder, and the job will not find it: a job runs in a folder of its "
        "own, with only the files bundle=DIR sends (bundle='.' sends this one)",
    ]
    assert {w.filename for w in caught} == {__file__}
    assert handle.status() == "queued" and handles[0].status() == "queued"
    assert gl.UnsentFileWarning is UnsentFileWarning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bundled = gl.submit(CommandJob(command=["python", "train.py"], placement=wait, bundle="."))
    gl.cancel([handle, *handles, bundled])


def test_a_namespace_folder_elsewhere_is_not_the_module(here: Path, tmp_path_factory: pytest.TempPathFactory,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of that name without __init__.py elsewhere on the path would be imported as
    an empty namespace package: the job would still not find the module's contents."""
    elsewhere = tmp_path_factory.mktemp("site")
    (elsewhere / "mymod").mkdir()
    monkeypatch.syspath_prepend(str(elsewhere))
    assert unsent_file(["mymod:f"], distributed=True) == "mymod.py"


def test_a_module_only_this_folder_provides_is_named_for_another_machine(here: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """This folder on the path another way (an editable install of it, under a name that is
    not this folder's own spelling: a symbolic link): found here only, which a job on this
    machine finds (the same Python) and one on another does not."""
    link = here.parent / "linked"
    link.symlink_to(here)
    monkeypatch.setattr(sys, "path", [*sys.path, str(link)])  # (where a .pth file of an editable install puts it)
    assert unsent_file(["mymod:f"], distributed=True) == "mymod.py"
    assert unsent_file(["mymod:f"], distributed=True, local=True) is None
    remote = Placement(target="remote")
    assert unsent_in_spec(FunctionJob(function="mymod:f", placement=remote)) == "mymod.py"
    assert unsent_in_spec(FunctionJob(function="mymod:f")) is None
    # (no target named: a self-hosted server's client sends it to a remote worker)
    assert unsent_in_spec(FunctionJob(function="mymod:f"), "remote") == "mymod.py"
    assert unsent_in_spec(FunctionJob(function="mymod:f", placement=Placement(target="local")), "remote") is None


def test_a_relative_entry_for_this_folder_is_not_the_jobs(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONPATH=. finds the module here; in the job, '.' is the job's own folder."""
    monkeypatch.setattr(sys, "path", [*sys.path, "."])
    assert unsent_file(["mymod:f"], distributed=True, local=True) == "mymod.py"


def test_many_specs_naming_one_file_warn_once(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(here / ".home"))
    wait = Placement(on_unschedulable="wait", target="remote")
    with pytest.warns(UnsentFileWarning) as caught:
        handles = gl.submit_many([FunctionJob(function="mymod:f", args=[i], placement=wait) for i in range(50)])
    assert len(caught) == 1 and caught[0].filename == __file__
    gl.cancel(handles)


def test_a_remote_functions_warning_names_it_and_points_at_the_users_line(here: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(here / ".home"))
    (here / "mymod2.py").write_text("import gpulayer as gl\n\n"
                                    "@gl.remote(bundle=None, target='remote', on_unschedulable='wait')\n"
                                    "def f(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(here))
    import mymod2  # type: ignore[import-not-found]

    with pytest.warns(UnsentFileWarning) as caught:
        handles = [mymod2.f.remote(1), *mymod2.f.map([1, 2])]
    assert [str(w.message).partition(" is in")[0] for w in caught] == ["f.remote(): mymod2.py", "f.map(): mymod2.py"]
    assert {w.filename for w in caught} == {__file__}
    gl.cancel(handles)
    monkeypatch.delitem(sys.modules, "mymod2")


def test_a_distributed_script_entry_its_bundle_does_not_hold_is_refused(here: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node would fail with python's "can't open file" once the whole group was placed."""
    monkeypatch.setenv("GPULAYER_HOME", str(here / ".home"))
    wait = Placement(on_unschedulable="wait", target="remote")  # (no worker: it stays queued)
    with pytest.raises(gl.InvalidInput) as missing:
        gl.submit(DistributedJob(nodes=2, entry="nope.py", bundle=".", placement=wait))
    assert str(missing.value) == ("entry 'nope.py': not in the bundle of '.': no such file there; a script entry is "
                                  "a path relative to the bundle's folder")
    (here / ".gpulayerignore").write_text("train.py\n")
    with pytest.raises(gl.InvalidInput, match=r"entry './train.py': not in the bundle of '.': the folder has it, but "
                                              r"its ignore rules \(.gitignore, .gpulayerignore\) leave it out"):
        gl.submit(DistributedJob(nodes=2, entry="./train.py", bundle=".", placement=wait))
    (here / ".gpulayerignore").unlink()
    # in a batch too, where the specs after the first that send this folder reuse its upload
    with pytest.raises(gl.InvalidInput, match=r"^entry 'nope.py': not in the bundle of '.'"):
        gl.submit_many([DistributedJob(nodes=2, entry=e, bundle=".", placement=wait) for e in ("train.py", "nope.py")])
    # what the bundle holds, and entries that are no script of its folder, go through
    handles = [gl.submit(DistributedJob(nodes=2, entry=entry, bundle=".", placement=wait))
               for entry in ("train.py", "./train.py", "pkg.main:fn", "mymod", "/opt/train.py")]
    assert {h.status() for h in handles} == {"queued"}
    gl.cancel(handles)
