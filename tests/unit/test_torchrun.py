"""The torchrun launcher plugin, the PyTorch integration's job specs, and the
distributed-support check, without starting any process that imports torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer import launchers, plugins, scheduling
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidArgument, InvalidInput, InvalidRequirement
from gpulayer.hookrecords import Capabilities, Device, HostInfo, Rendezvous, SupportLevel
from gpulayer.records import WorkerRecord
from gpulayer.specs import DistributedJob, Requirements

RDZV = Rendezvous(master_addr="10.0.0.5", master_port=31234, nnodes=2, run_id="job-abc-1")


def _opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_torchrun_is_offered_through_the_hook() -> None:
    launchers = plugins.launchers()
    assert "torchrun" in launchers
    assert launchers["torchrun"].build is not None


def test_build_script_entry_uses_static_rendezvous_at_node_zero() -> None:
    import gpulayer_torchrun

    job = DistributedJob(nodes=2, nproc_per_node=3, entry="train.py", args=["--lr", "0.1"])
    cmd = gpulayer_torchrun.build(job, RDZV, 1, "/opt/py/bin/python")
    argv = cmd.argv
    assert argv[:3] == ["/opt/py/bin/python", "-m", "torch.distributed.run"]
    assert _opt(argv, "--nnodes") == "2"
    assert _opt(argv, "--node-rank") == "1"
    assert _opt(argv, "--nproc-per-node") == "3"
    assert _opt(argv, "--master-addr") == "10.0.0.5"
    assert _opt(argv, "--master-port") == "31234"
    assert _opt(argv, "--rdzv-backend") == "static"
    assert _opt(argv, "--rdzv-id") == "job-abc-1"
    assert _opt(argv, "--max-restarts") == "0"
    assert _opt(argv, "--tee") == "3"
    assert argv[-3:] == ["train.py", "--lr", "0.1"]
    assert cmd.env["GPULAYER_RDZV_ID"] == "job-abc-1"
    assert cmd.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
    # torchrun gives each rank its own RANK/LOCAL_RANK/WORLD_SIZE; the launcher sets none
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE"} & set(cmd.env)


def test_build_function_entry_runs_the_shim_by_path() -> None:
    import gpulayer_torchrun

    job = DistributedJob(nodes=2, entry="pkg.train:main", args=["7"])
    argv = gpulayer_torchrun.build(job, RDZV, 0, "python").argv
    assert argv[-3:] == [gpulayer_torchrun.ENTRY_SHIM, "pkg.train:main", "7"]
    assert Path(gpulayer_torchrun.ENTRY_SHIM).is_file()
    module = gpulayer_torchrun.build(DistributedJob(nodes=2, entry="pkg.train"), RDZV, 0, "python").argv
    assert module[-2:] == ["--module", "pkg.train"]


def test_build_refuses_a_rank_outside_the_group() -> None:
    import gpulayer_torchrun

    with pytest.raises(ValueError, match="node_rank 2"):
        gpulayer_torchrun.build(DistributedJob(nodes=2, entry="t.py"), RDZV, 2, "python")


def test_entry_shim_calls_the_function_from_the_working_directory(tmp_path: Path) -> None:
    import gpulayer_torchrun

    (tmp_path / "entry.py").write_text("raise SystemExit('the shim must not import this')\n")
    (tmp_path / "mylib.py").write_text(
        "import json, sys\n"
        "def main(*args):\n    print(json.dumps({'args': list(args), 'argv': sys.argv}))\n"
        "def boom():\n    raise RuntimeError('rank failed')\n"
    )
    r = subprocess.run([sys.executable, gpulayer_torchrun.ENTRY_SHIM, "mylib:main", "a", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"args": ["a", "1"], "argv": ["mylib:main", "a", "1"]}
    r = subprocess.run([sys.executable, gpulayer_torchrun.ENTRY_SHIM, "mylib:boom"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "rank failed" in r.stderr


# --------------------------------------------------------------------------- gpulayer.torch


def test_importing_gpulayer_torch_does_not_import_torch() -> None:
    code = "import sys, gpulayer.torch; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_trainer_one_process_is_a_command_job(tmp_path: Path) -> None:
    from gpulayer.torch import Trainer

    (tmp_path / "train.py").write_text("print('hi')\n")
    t = Trainer("train.py", bundle=tmp_path, args=["--epochs", 2])
    assert t.job.kind == "command"
    assert t.job.command[0] == "python"
    assert t.job.command[-3:] == ["train.py", "--epochs", "2"]
    assert t.job.requirements.frameworks == {"torch": ""}
    assert t.job.placement.on_unschedulable == "fail"


def test_trainer_more_processes_is_a_distributed_job(tmp_path: Path) -> None:
    from gpulayer.torch import Trainer

    t = Trainer("pkg.train:main", nodes=2, gpus_per_node=4, accelerator="cuda", bundle=tmp_path,
                frameworks=["torch>=2.2"], retries=1, timeout=60)
    job = t.job
    assert isinstance(job, DistributedJob)
    assert (job.nodes, job.nproc_per_node, job.launcher) == (2, 4, "torchrun")
    assert job.requirements.accelerator == "cuda" and job.requirements.gpus == 4
    assert job.requirements.frameworks == {"torch": ">=2.2", "torch.cuda": ""}
    assert (job.retries, job.timeout) == (1, 60)
    one_node = Trainer("x:y", nproc_per_node=2, bundle=None)
    assert one_node.job.kind == "distributed"


@pytest.mark.parametrize(("accelerator", "sub"), [("cuda", "torch.cuda"), ("rocm", "torch.rocm"),
                                                  ("mps", "torch.mps"), (None, None), ("cpu", None)])
def test_torch_requirements_follow_the_accelerator(accelerator: str | None, sub: str | None) -> None:
    from gpulayer.torch import torch_requirements

    want = {"torch": ""} | ({sub: ""} if sub else {})
    assert torch_requirements(None, accelerator) == want


def test_trainer_refuses_a_missing_script_and_gpus_without_an_accelerator(tmp_path: Path) -> None:
    from gpulayer.torch import Trainer

    with pytest.raises(InvalidArgument, match="no such file in the bundle"):
        Trainer("missing.py", bundle=tmp_path)
    with pytest.raises(InvalidArgument, match=r"^Trainer\(bundle='/nonexistent'\): no such directory"):
        Trainer("train.py", bundle="/nonexistent")  # (the bundle is wrong, not the entry)
    with pytest.raises(InvalidRequirement, match=r"Trainer\(gpus_per_node=2\): devices need an accelerator"):
        Trainer("train:main", gpus_per_node=2, bundle=None)


def test_single_process_shim_sets_a_world_of_one(tmp_path: Path) -> None:
    from gpulayer.torch import SINGLE_PROCESS_SHIM

    (tmp_path / "show.py").write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR']\n"
        "print(json.dumps({'env': {k: os.environ[k] for k in keys}, 'argv': sys.argv,\n"
        "                  'port': int(os.environ['MASTER_PORT']), 'name': __name__}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    r = subprocess.run([sys.executable, "-c", SINGLE_PROCESS_SHIM, "show.py", "x"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["env"] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    assert out["argv"] == ["show.py", "x"] and out["name"] == "__main__" and out["port"] > 0


# --------------------------------------------------------------------------- scheduling


def _worker(devices: list[Device]) -> WorkerRecord:
    host = HostInfo(os="darwin", arch="arm64", cpu_count=8, memory_bytes=32 * 10**9, python_version="3.11.9")
    return WorkerRecord(id="wkr-mac", name="mac", capabilities=Capabilities(host=host, devices=devices))


def test_distributed_work_on_a_device_without_distributed_support_is_refused() -> None:
    mps = Device(kind="mps", index=0, name="Apple GPU", distributed=SupportLevel.UNSUPPORTED,
                 independent=SupportLevel.FIXTURE_TESTED)
    worker = _worker([mps])
    job = DistributedJob(nodes=2, entry="train.py", requirements=Requirements(accelerator="mps"))
    reasons = scheduling.check(job, worker)
    assert [r.code for r in reasons] == ["distributed"]
    assert reasons[0].render() == (
        "wkr-mac: mps device(s) do not support distributed work (distributed=unsupported)")
    # the same device is fine for one process
    single = DistributedJob(nodes=1, nproc_per_node=1, entry="train.py",
                            requirements=Requirements(accelerator="mps"))
    assert scheduling.check(single, worker) == []


@pytest.mark.parametrize(("entry", "args", "says"), [
    ("my-train", [], "entry 'my-train': accepted: a script ('train.py'), a module ('pkg.train') or a function"),
    ("trf:", [], "entry 'trf:': a function is written 'package.module:function'"),
    (":main", [], "entry ':main': a function is written 'package.module:function'"),
    ("pkg.train:", [], "entry 'pkg.train:': a function is written"),
    ("python", ["-u", "train.py", "--lr", "1"],
     "entry 'python': every rank runs the entry with the job's Python; give 'train.py' (or a module or "
     "function), not 'python' before it"),
    ("python3.11", ["-m", "pkg.train"], "entry 'python3.11': every rank runs the entry with the job's Python; "
     "give 'pkg.train'"),
    # the value of an interpreter's option is not the script: it said "give 'ignore'", "give 'print(1)'"
    ("python", ["-W", "ignore", "train.py"], "entry 'python': every rank runs the entry with the job's Python; "
     "give 'train.py'"),
    ("python", ["-X", "dev", "-um", "pkg.train"], "entry 'python': every rank runs the entry with the job's Python; "
     "give 'pkg.train'"),
    ("python", ["-uc", "print(1)"], "entry 'python': every rank runs the entry with the job's Python, and -c code "
     "cannot be an entry; write it to a script in the bundle and give that ('train.py')"),
    ("python", [], "entry 'python': every rank runs the entry with the job's Python; give 'train.py'"),
])
def test_an_entry_no_rank_could_start_is_refused_where_it_is_submitted(
        entry: str, args: list[str], says: str, cp: ControlPlane) -> None:
    """The launcher's check runs in the control plane's submit (every path: SDK, CLI, a
    server's API) and in the SDK's and CLI's own building of the spec, before any node is placed."""
    from gpulayer.torch import launch

    job = DistributedJob(nodes=2, entry=entry, args=args)
    with pytest.raises(InvalidInput) as refused:
        cp.submit(job)
    assert str(refused.value).startswith(f"launcher 'torchrun' cannot run this job: {says}")
    assert cp.list_jobs() == []
    with pytest.raises(InvalidInput, match=re.escape(says)):
        launch(entry, nodes=2, args=args, bundle=None)


@pytest.mark.parametrize("entry", ["train.py", "src/train.py", "pkg.train", "pkg.train:main", "pkg:Trainer.run"])
def test_entries_a_rank_can_start_pass_the_check(entry: str) -> None:
    launchers.check_launch(DistributedJob(nodes=2, entry=entry))


@pytest.mark.parametrize(("words", "entry", "args"), [
    (["python", "train.py", "--lr", "1"], "train.py", ["--lr", "1"]),
    (["/usr/bin/python3.11", "train.py"], "train.py", []),
    (["python", "-m", "pkg.train", "-x"], "pkg.train", ["-x"]),
    (["python", "-u", "train.py"], "python", ["-u", "train.py"]),  # (refused by the launcher's check)
    (["train.py", "python"], "train.py", ["python"]),
    (["python"], "python", []),
])
def test_the_cli_takes_python_before_a_distributed_entry_as_written_for_one_process(
        words: list[str], entry: str, args: list[str]) -> None:
    from gpulayer.cli.jobs import _entry_words

    assert _entry_words(words) == (entry, args)


@pytest.mark.parametrize(("options", "says"), [
    ({"args": 5}, "Trainer(args=5): not a list; accepted: a list of arguments such as ['--epochs', '3']"),
    ({"args": "--epochs 3"}, "Trainer(args='--epochs 3'): a string, not a list; accepted: a list of arguments"),
    ({"args": ""}, "Trainer(args=''): a string, not a list"),
    ({"args": False}, "Trainer(args=False): not a list"),
    ({"args": ["--lr", None]}, "Trainer(args[1]=None): accepted: text or a number, as on a command line"),
    ({"args": [True]}, "Trainer(args[0]=True): accepted: text or a number"),
    ({"client": "x"}, "Trainer(client='x'): not a client; accepted: what gl.connect() returns"),
    ({"bundle": "/nonexistent"}, "Trainer(bundle='/nonexistent'): no such directory; accepted: the path of a directory"),
])
def test_a_trainer_s_bad_option_is_refused_as_it_is_described(options: dict[str, Any], says: str,
                                                              tmp_path: Path) -> None:
    from gpulayer.torch import Trainer

    (tmp_path / "train.py").write_text("")
    options = {"bundle": tmp_path, **options}
    with pytest.raises(InvalidArgument) as refused:
        Trainer("train.py", nodes=2, **options)
    assert str(refused.value).startswith(says)


def test_a_trainer_takes_numbers_and_no_args_as_a_command_line_would(tmp_path: Path) -> None:
    from gpulayer.torch import Trainer

    (tmp_path / "train.py").write_text("")
    assert Trainer("train.py", nodes=2, args=["--lr", 0.1, 3], bundle=tmp_path).args == ["--lr", "0.1", "3"]
    assert Trainer("train.py", nodes=2, args=None, bundle=tmp_path).args == []


def test_fit_checks_its_timeout_before_it_submits(tmp_path: Path, gpulayer_isolated: None) -> None:
    from gpulayer.client import connect
    from gpulayer.torch import Trainer

    (tmp_path / "train.py").write_text("")
    trainer = Trainer("train.py", nodes=2, bundle=tmp_path)
    for timeout in ("5", -1, float("nan")):
        with pytest.raises(InvalidArgument, match=re.escape(f"Trainer.fit(timeout={timeout!r}): accepted: a number")):
            trainer.fit(timeout=timeout)  # type: ignore[arg-type]
    assert trainer.handle is None and connect().api.list_jobs() == []


def test_a_launcher_named_makes_a_distributed_job_of_one_process_too(tmp_path: Path) -> None:
    """`gpulayer submit --launcher torchrun -- train.py` validated the launcher, then ran
    `train.py` as a plain command (not found: it is no program)."""
    from gpulayer.cli.jobs import spec_from_flags
    from gpulayer.torch import Trainer

    (tmp_path / "train.py").write_text("")
    trainer = Trainer("train.py", launcher="torchrun", bundle=tmp_path)
    assert trainer.distributed and (trainer.job.nodes, trainer.job.nproc_per_node) == (1, 1)
    assert not Trainer("train.py", bundle=tmp_path).distributed  # (no launcher named: one plain process)
    flags: dict[str, Any] = {name: None for name in (
        "accelerator", "allow_unknown_accelerator", "gpus", "min_gpu_memory", "compute_capability", "python_version",
        "os_name", "cpus", "memory", "profile", "target", "fallback", "on_unschedulable", "timeout", "retries",
        "priority", "name", "bundle", "nodes", "nproc_per_node")}
    flags.update(framework=[], label=[], prefer=[], env=[], launcher="torchrun", command=["python", "train.py", "-x"])
    spec = spec_from_flags(flags)
    assert isinstance(spec, DistributedJob) and (spec.entry, spec.args, spec.launcher) == ("train.py", ["-x"], "torchrun")
