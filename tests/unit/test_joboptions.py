"""One front end for describing a job: the options record, its builders, and the wording of
bad input to ``@gl.remote``, ``Trainer`` and ``launch()`` (hand-built specs: test_specs.py).

The command line's flags are checked end to end in tests/integration/test_jobs.py.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer import joboptions
from gpulayer.errors import InvalidArgument, InvalidInput, InvalidRequirement
from gpulayer.joboptions import JobOptions, SharedOptions
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.torch import Trainer, TrainerOptions, launch
from gpulayer.worker.function_runner import IMPORTING_ENV

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")

#: pydantic's own words, none of which may reach a user
RESIDUE = ("Value error", "Input should", "errors.pydantic.dev", "validation error", "[type=")


def double(x: int) -> int:
    return 2 * x


def refused(make: Callable[[], object], kind: type[Exception] = InvalidInput) -> str:
    with pytest.raises(InvalidInput) as info:
        make()
    assert type(info.value) is kind, (type(info.value), str(info.value))
    text = str(info.value)
    for word in RESIDUE:
        assert word not in text, text
    return text


# --------------------------------------------------------------------------- the options record

EVERY_OPTION: JobOptions = {
    "accelerator": "cuda", "gpus": 2, "min_gpu_memory_gb": 40, "compute_capability": "8.0",
    "frameworks": {"jax": ">=0.4"}, "python_version": "3.10", "os": "linux", "cpus": 4, "memory_gb": 16,
    "labels": {"zone": "a"}, "profile": "jax-cuda", "target": "local", "fallback_targets": ["remote"],
    "on_unschedulable": "wait", "prefer": ["ec2/us-west-2"], "timeout": 60, "retries": 1, "priority": 5, "env": {"A": "1"}, "name": "n",
}


def test_the_options_cover_every_field_users_set() -> None:
    fields = {f"requirements.{f}" for f in Requirements.model_fields}
    fields |= {f"placement.{f}" for f in Placement.model_fields}
    fields |= {"timeout", "retries", "priority", "env", "name", "bundle", "after", "after_ended"}
    assert set(joboptions.OPTION_FIELDS.values()) == fields
    assert set(JobOptions.__optional_keys__) == {*joboptions.OPTION_FIELDS, "allow_unknown_accelerator"}


def test_every_option_reaches_the_spec() -> None:
    job = joboptions.command_job(["true"], EVERY_OPTION, joboptions.keyword_spelling("test"))
    req = job.requirements
    assert (req.accelerator, req.gpus, req.min_gpu_memory_gb, req.compute_capability) == ("cuda", 2, 40, ">=8.0")
    assert (req.frameworks, req.python, req.os, req.cpus, req.memory_gb) == ({"jax": ">=0.4"}, ">=3.10", "linux", 4, 16)
    assert (req.labels, req.profile) == ({"zone": "a"}, "jax-cuda")
    assert job.placement.model_dump() == {"target": "local", "fallback_targets": ["remote"], "on_unschedulable": "wait",
                                          "prefer": ["ec2/us-west-2"]}
    assert (job.timeout, job.retries, job.priority, job.env, job.name) == (60, 1, 5, {"A": "1"}, "n")


def test_remote_takes_every_option_and_builds_the_same_spec() -> None:
    fn = gl.remote(**EVERY_OPTION, bundle=None)(double)
    spec = fn.spec(3)
    built = joboptions.function_job(spec.function, [3], {}, {**EVERY_OPTION, "bundle": None},
                                    joboptions.keyword_spelling("test"))
    assert spec == built
    assert spec.requirements.compute_capability == ">=8.0"
    assert fn(3) == 6


def test_trainer_and_launch_take_one_option_set() -> None:
    for call in (Trainer.__init__, launch):
        kinds = [p.kind for p in inspect.signature(call).parameters.values() if p.name not in ("self",)]
        assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_KEYWORD]
    assert set(SharedOptions.__optional_keys__) <= set(TrainerOptions.__optional_keys__)
    shared: dict[str, Any] = {k: v for k, v in EVERY_OPTION.items() if k != "gpus"}
    t = Trainer("pkg.train:main", gpus_per_node=2, bundle=None, **shared)
    assert t.job.kind == "distributed" and t.nproc_per_node == 2
    req = t.job.requirements
    assert req.gpus == 2 and req.compute_capability == ">=8.0" and req.min_gpu_memory_gb == 40
    assert req.frameworks == {"torch": "", "torch.cuda": "", "jax": ">=0.4"}
    assert t.job.placement.on_unschedulable == "wait"


def test_a_target_not_given_is_left_for_the_client_to_fill() -> None:
    assert "target" not in gl.remote(double).spec(1).placement.model_fields_set
    assert "target" not in Trainer("x:y", bundle=None).job.placement.model_fields_set
    assert "target" not in Trainer("x:y", nodes=2, bundle=None).job.placement.model_fields_set
    assert gl.remote(target="remote")(double).spec(1).placement.target == "remote"
    assert gl.remote(double).spec(1).placement.on_unschedulable == "fail"


def test_one_process_trainer_keeps_the_checked_fields() -> None:
    t = Trainer("pkg.train:main", bundle=None, env={"A": "1"}, retries=2, labels={"k": "v"})
    assert isinstance(t.job, CommandJob)
    assert t.job.command[-1] == "pkg.train:main"
    assert (t.job.env, t.job.retries, t.job.requirements.labels, t.job.name) == ({"A": "1"}, 2, {"k": "v"},
                                                                                 "pkg.train:main")


# --------------------------------------------------------------------------- bad input, Python front ends

KINDS = "cuda, mps, rocm"
TEXT = "UTF-8 text without NUL bytes"

PYTHON_BAD: list[tuple[Callable[[], object], type[Exception], str]] = [
    (lambda: gl.remote(timeout=math.inf)(double), InvalidInput,
     "@gl.remote(timeout=inf): not a finite number; accepted: a number of seconds > 0 (leave it out for no limit)"),
    (lambda: gl.remote(gpus=1)(double), InvalidRequirement,
     "@gl.remote(gpus=1): devices need an accelerator, and none is named; accepted: gpus together with "
     "accelerator='KIND', or with a profile= that names one"),
    (lambda: gl.remote(min_gpu_memory_gb=40)(double), InvalidRequirement,
     "@gl.remote(min_gpu_memory_gb=40): applies only to accelerator devices, and none is named; accepted: "
     "min_gpu_memory_gb together with accelerator='KIND', or with a profile= that names one"),
    (lambda: gl.remote(gpus=1, profile="cpu")(double).spec(1), InvalidRequirement,
     "@gl.remote(gpus=1): devices need an accelerator, and the profile 'cpu' names none; accepted: gpus together "
     f"with accelerator='KIND' ({KINDS}), or with a profile= that names one"),
    (lambda: gl.remote(accelerator="npu")(double).spec(1), InvalidRequirement,
     f"@gl.remote(accelerator='npu'): no installed plugin detects this accelerator kind; known kinds: {KINDS}, "
     "or cpu for none. For a kind only the server's workers know, pass allow_unknown_accelerator=True"),
    (lambda: gl.remote(profile="pytorch-tpu")(double).spec(1), InvalidRequirement,
     "@gl.remote(profile='pytorch-tpu'): no installed plugin offers this runtime profile; known profiles: cpu, "
     "cupy-cuda, jax-cuda, mlx, onnxruntime-cuda, pytorch-cuda, pytorch-mps, pytorch-rocm"),
    (lambda: gl.remote(frameworks=["jax", "torch>>2"])(double), InvalidRequirement,
     "@gl.remote(frameworks[1]='torch>>2'): '>>2' is not a PEP 440 version specifier; accepted: comma-separated "
     "clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"),
    (lambda: gl.remote(frameworks={"to rch": ">2"})(double), InvalidRequirement,
     "@gl.remote(frameworks={'to rch': '>2'}): not a framework name; accepted: a name such as 'torch' or 'torch.cuda'"),
    (lambda: gl.remote(env={"PATH": "a\x00b"})(double), InvalidInput,
     f"@gl.remote(env={{'PATH': 'a\\x00b'}}): contains a NUL byte at index 1; accepted: {TEXT}"),
    # (an empty path would send the current folder: a `--bundle "$DIR"` with DIR unset)
    (lambda: gl.remote(bundle="")(double), InvalidInput,
     "@gl.remote(bundle=''): must not be empty; accepted: the path of a directory"),
    (lambda: Trainer("train.py", bundle=""), InvalidInput,
     "Trainer(bundle=''): must not be empty; accepted: the path of a directory"),
    (lambda: CommandJob(command=["python", "train.py"], bundle=""), InvalidInput,
     "CommandJob(bundle=''): must not be empty; accepted: the path of a directory"),
    # (at submit: the bundle builder's "bundle directory '...' does not exist", naming no option)
    (lambda: gl.remote(bundle="/nonexistent/gl-bundle")(double).spec(1), InvalidArgument,
     "@gl.remote(bundle='/nonexistent/gl-bundle'): no such directory; accepted: the path of a directory"),
    (lambda: gl.remote(fallback_targets=["moon"])(double), InvalidInput,
     "@gl.remote(fallback_targets[0]='moon'): not one of the choices; accepted: local, remote or cloud, each listed once"),
    (lambda: gl.remote(on_unschedulable="sometimes")(double), InvalidInput,
     "@gl.remote(on_unschedulable='sometimes'): not one of the choices; accepted: fail or wait"),
    (lambda: gl.remote(double).spec("\udcff"), InvalidArgument,
     "double.spec(): args[0]: '\\udcff' is not valid UTF-8 (a lone surrogate '\\udcff' at index 0); accepted: valid Unicode text"),
    (lambda: gl.remote(gpus_per_node=1)(double), InvalidArgument,  # type: ignore[call-arg]
     "@gl.remote: unknown option(s) gpus_per_node (did you mean gpus?); accepted: accelerator, after, after_ended, "
     "allow_unknown_accelerator, bundle, compute_capability, cpus, env, fallback_targets, frameworks, gpus, labels, "
     "memory_gb, min_gpu_memory_gb, name, on_unschedulable, os, prefer, priority, profile, python_version, retries, "
     "target, timeout"),
    (lambda: Trainer("x:y", gpus_per_node=2, bundle=None), InvalidRequirement,
     "Trainer(gpus_per_node=2): devices need an accelerator, and none is named; accepted: gpus_per_node together "
     f"with accelerator='KIND' ({KINDS}), or with a profile= that names one"),
    (lambda: launch("x:y", gpus_per_node=2, bundle=None), InvalidRequirement,
     "launch(gpus_per_node=2): devices need an accelerator, and none is named; accepted: gpus_per_node together "
     f"with accelerator='KIND' ({KINDS}), or with a profile= that names one"),
    # .options(): named as that call, not as the decoration its function had
    (lambda: gl.remote(double).options(after="prepare"), InvalidInput,
     "double.options(after[0]='prepare'): not a job id; accepted: a job's id, job- and hexadecimal digits "
     "(gpulayer jobs list)"),
    (lambda: gl.remote(accelerator="cuda")(double).options(gpus=-1), InvalidRequirement,
     "double.options(gpus=-1): must be at least 0; accepted: a whole number >= 0 (devices per node)"),
    (lambda: gl.remote(double).options(accelerator="npu").spec(1), InvalidRequirement,
     f"double.options(accelerator='npu'): no installed plugin detects this accelerator kind; known kinds: {KINDS}, "
     "or cpu for none. For a kind only the server's workers know, pass allow_unknown_accelerator=True"),
    (lambda: gl.remote(double).options(gpus_per_node=1), InvalidArgument,  # type: ignore[call-arg]
     "double.options(): unknown option(s) gpus_per_node (did you mean gpus?); accepted: accelerator, after, after_ended, "
     "allow_unknown_accelerator, bundle, compute_capability, cpus, env, fallback_targets, frameworks, gpus, labels, "
     "memory_gb, min_gpu_memory_gb, name, on_unschedulable, os, prefer, priority, profile, python_version, retries, "
     "target, timeout"),
    (lambda: Trainer("x:y", nodes=2, launcher="nosuch", bundle=None), InvalidInput,
     "Trainer(launcher='nosuch'): no installed plugin offers this distributed launcher; installed launchers: torchrun"),
    (lambda: Trainer("x:y", args=["--tag", "a\x00"], bundle=None), InvalidInput,
     f"Trainer(args[1]='a\\x00'): contains a NUL byte at index 1; accepted: {TEXT}"),
    (lambda: Trainer("tr\x00ain.py"), InvalidInput,
     f"Trainer(entry='tr\\x00ain.py'): contains a NUL byte at index 2; accepted: {TEXT}"),
    (lambda: Trainer("x:y", args="--epochs 3", bundle=None), InvalidArgument,  # type: ignore[arg-type]
     "Trainer(args='--epochs 3'): a string, not a list; accepted: a list of arguments such as ['--epochs', '3']"),
    (lambda: launch("x:y", timeout=math.nan, bundle=None), InvalidInput,
     "launch(timeout=nan): not a finite number; accepted: a number of seconds > 0 (leave it out for no limit)"),
    (lambda: Trainer("x:y", nodes=0, bundle=None), InvalidInput,
     "Trainer(nodes=0): must be at least 1; accepted: a whole number from 1 to 1024"),
    (lambda: Trainer("x:y", frameworks=["torch>>2"], bundle=None), InvalidRequirement,
     "Trainer(frameworks[0]='torch>>2'): '>>2' is not a PEP 440 version specifier; accepted: comma-separated clauses "
     "such as '>=2.2', '==2.3.*', '>=1.0,<2'"),
    (lambda: Trainer("x:y", gpus=2, bundle=None), InvalidArgument,  # type: ignore[call-arg]
     "Trainer: unknown option(s) gpus (did you mean gpus_per_node?); accepted: accelerator, after, after_ended, allow_unknown_accelerator, "
     "args, bundle, client, compute_capability, cpus, env, fallback_targets, frameworks, gpus_per_node, labels, "
     "launcher, memory_gb, min_gpu_memory_gb, name, nodes, nproc_per_node, on_unschedulable, os, prefer, priority, profile, "
     "python_version, retries, target, timeout"),
]


@pytest.mark.parametrize(("make", "kind", "message"), PYTHON_BAD, ids=[m[:60] for _, _, m in PYTHON_BAD])
def test_python_front_ends_name_the_input_as_written(make: Callable[[], object], kind: type[Exception],
                                                     message: str) -> None:
    assert refused(make, kind) == message


def test_remote_checks_plugins_at_submit_not_at_import() -> None:
    # a worker imports the function's module too, and may have other plugins than the submitter
    fn = gl.remote(accelerator="npu", profile="npu-torch")(double)
    with pytest.raises(InvalidRequirement, match="npu-torch"):
        fn.spec(1)


def test_a_module_imported_by_the_function_runner_does_not_check_its_options_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # they were checked when the job was submitted; a .remote() made by the task checks its own
    monkeypatch.setenv(IMPORTING_ENV, "jobmod:double")
    fn = gl.remote(gpus=1)(double)
    assert fn(2) == 4
    with pytest.raises(InvalidRequirement, match="devices need an accelerator"):
        fn.spec(1)
    monkeypatch.delenv(IMPORTING_ENV)
    with pytest.raises(InvalidRequirement, match="devices need an accelerator"):
        gl.remote(gpus=1)(double)


def test_an_accelerator_only_the_server_knows_passes_with_the_escape_hatch() -> None:
    spec = gl.remote(accelerator="NPU", allow_unknown_accelerator=True)(double).spec(1)
    assert spec.requirements.accelerator == "npu"
    t = Trainer("x:y", accelerator="npu", allow_unknown_accelerator=True, bundle=None)
    assert t.job.requirements.frameworks == {"torch": ""}


def test_known_kinds_are_the_detector_plugins_kinds(fake_accelerator: Callable[..., object],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake_accelerator(kind="npu")
    assert gl.remote(accelerator="npu", gpus=2)(double).spec(1).requirements.device_count == 2
    text = refused(lambda: gl.remote(accelerator="tpu")(double).spec(1), InvalidRequirement)
    assert "known kinds: cuda, mps, npu, rocm, or cpu for none" in text


def test_cpu_means_no_accelerator_and_zero_gpus_need_none() -> None:
    assert gl.remote(accelerator="cpu")(double).spec(1).requirements.accelerator is None
    assert gl.remote(gpus=0)(double).spec(1).requirements.device_count == 0


def test_trainer_refuses_a_script_missing_from_the_bundle(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no such file in the bundle"):
        Trainer("missing.py", bundle=tmp_path)
