"""An explanation in words: relaxations named as each front end spells its options, and the
text ``gpulayer explain`` prints (pure: records built by the scheduler's own survey)."""

from __future__ import annotations

import pytest

from gpulayer.cli.jobs import SUBMIT_SPELLING
from gpulayer.explanations import elapsed_text, relaxation_text, render
from gpulayer.joboptions import keyword_spelling
from gpulayer.records import Explanation, Relaxation, RunningTask, TaskState
from gpulayer.scheduling import nearest, place
from gpulayer.sdk import REMOTE_SPELLING
from tests.factories import make_cuda_devices, make_distributed_job, make_job, make_state, make_worker, queued

TRAINER = keyword_spelling("Trainer", gpus="gpus_per_node")

RELAXATIONS = [
    (Relaxation(field="requirements.gpus", action="relax", was="2", value="1", fits=3),
     "relax --gpus to 1 and 3 workers fit", "relax gpus to 1 and 3 workers fit",
     "relax gpus_per_node to 1 and 3 workers fit"),
    (Relaxation(field="requirements.frameworks.jax", action="drop", was="jax", fits=2),
     "drop --framework jax and 2 workers fit", "drop 'jax' from frameworks and 2 workers fit",
     "drop 'jax' from frameworks and 2 workers fit"),
    (Relaxation(field="requirements.frameworks.torch", action="relax", was="torch>=2.2", value="torch", fits=1),
     "relax --framework 'torch>=2.2' to torch and 1 worker fits",
     "relax frameworks['torch'] from '>=2.2' to any version and 1 worker fits",
     "relax frameworks['torch'] from '>=2.2' to any version and 1 worker fits"),
    (Relaxation(field="requirements.labels.zone", action="drop", was="zone=us-east", fits=4),
     "drop --label zone=us-east and 4 workers fit", "drop 'zone' from labels and 4 workers fit",
     "drop 'zone' from labels and 4 workers fit"),
    (Relaxation(field="requirements.min_gpu_memory_gb", action="relax", was="96", value="80", fits=1),
     "relax --min-gpu-memory to 80 and 1 worker fits", "relax min_gpu_memory_gb to 80 and 1 worker fits",
     "relax min_gpu_memory_gb to 80 and 1 worker fits"),
    (Relaxation(field="requirements.python", action="drop", was=">=3.13", fits=5),
     "drop --python-version '>=3.13' and 5 workers fit", "drop python_version='>=3.13' and 5 workers fit",
     "drop python_version='>=3.13' and 5 workers fit"),
    (Relaxation(field="placement.fallback_targets", action="add", value="remote", fits=1),
     "add --fallback remote and 1 worker fits", "add 'remote' to fallback_targets and 1 worker fits",
     "add 'remote' to fallback_targets and 1 worker fits"),
    (Relaxation(field="nodes", action="relax", was="5", value="3", fits=3),
     "relax --nodes to 3 and 3 workers fit", "relax nodes to 3 and 3 workers fit", "relax nodes to 3 and 3 workers fit"),
]


@pytest.mark.parametrize(("r", "cli", "remote", "trainer"), RELAXATIONS, ids=[r[0].field for r in RELAXATIONS])
def test_a_relaxation_names_the_option_as_each_front_end_spells_it(r: Relaxation, cli: str, remote: str,
                                                                   trainer: str) -> None:
    assert relaxation_text(r, SUBMIT_SPELLING) == cli
    assert relaxation_text(r, REMOTE_SPELLING) == remote
    assert relaxation_text(r, TRAINER) == trainer


def explanation(job: object, *states: object, **fields: object) -> Explanation:
    survey = nearest.survey(job, list(states))  # type: ignore[arg-type]
    decision = place([queued(job, "job-x")], list(states), 1000.0).decisions["job-x"]  # type: ignore[arg-type]
    return Explanation(spec=job, decision=decision, workers=survey.workers, closest=survey.closest,  # type: ignore[arg-type]
                       relaxations=survey.relaxations, at=1000.0, **fields)  # type: ignore[arg-type]


def test_the_text_of_an_unschedulable_job() -> None:
    job = make_job(accelerator="cuda", gpus=2, frameworks={"torch": ">=2.2"})
    e = explanation(job, make_state(make_worker("wkr-10c5089a6044")),
                    make_state(make_worker("wkr-471ad43b2467", devices=make_cuda_devices(1), frameworks={"torch": "2.3"})),
                    offers=[])
    assert render(e, SUBMIT_SPELLING) == "\n".join([
        "would fail: scheduling: no eligible worker",
        "",
        "wkr-10c5089a6044: needs 2 usable cuda device(s), worker has 0",
        "wkr-10c5089a6044: framework 'torch' not installed",
        "wkr-471ad43b2467: needs 2 usable cuda device(s), worker has 1",
        "offers: no configured provider offers a machine that fits",
        "",
        "closest: wkr-471ad43b2467 has 1 of 2 cuda devices; "
        "wkr-10c5089a6044 has 0 of 2 cuda devices and has no torch installed (one install away)",
        "relax --gpus to 1 and 1 worker fits",
    ])
    e._spelling = REMOTE_SPELLING
    assert str(e).endswith("relax gpus to 1 and 1 worker fits")


def test_the_text_of_a_job_that_would_wait_names_what_busy_workers_run_and_until_when() -> None:
    job = make_job(accelerator="cuda")
    busy = make_state(make_worker("wkr-busy", devices=make_cuda_devices(1)), busy=[("cuda", 0)])
    e = explanation(job, busy, job_id="job-x", state="queued", queue_position=2)
    e.workers[0].running = [RunningTask(job_id="job-other", task_id="tsk-1", state=TaskState.RUNNING,
                                        accelerator="cuda", devices=[0], started_at=1000.0 - 125, ends_by=1000.0 + 600)]
    e.workers[0].frees_at = 1000.0 + 600
    assert render(e, SUBMIT_SPELLING).splitlines() == [
        "job job-x: queued, position 2 in the queue",
        "if placed now on its own: would wait: 1 compatible worker(s) busy",
        "",
        "wkr-busy: compatible but busy: no free cuda device (running job-other cuda 0 for 2m05s, ends within "
        "10m00s; room for it within 10m00s)",
    ]


def test_another_owners_job_is_not_named() -> None:
    job = make_job()
    busy = make_state(make_worker("wkr-busy"), busy_cpu_slots=1)
    e = explanation(job, busy)
    e.workers[0].running = [RunningTask(state=TaskState.ASSIGNED)]
    assert render(e, SUBMIT_SPELLING).splitlines()[-1] == (
        "wkr-busy: compatible but busy: no free CPU slot (running another user's job (not started yet))")


def test_what_the_decision_says_of_a_target_is_shown_as_submit_shows_it() -> None:
    """``no cloud worker registered ...`` and ``... the job needs 4 at once`` are reasons of
    the decision that name a target, not a worker: explain printed only the workers' lines,
    so it never said that the target had no worker at all, or too few for the gang."""
    local = make_state(make_worker("wkr-a"))
    e = explanation(make_job(target="cloud"), local)
    assert render(e, SUBMIT_SPELLING).splitlines()[:4] == [
        "would fail: scheduling: no eligible worker", "",
        "cloud: no cloud worker registered and no provider offered a machine",
        "wkr-a: serves local jobs (origin local), job allows cloud"]
    e = explanation(make_distributed_job(4), local, make_state(make_worker("wkr-b")))
    assert render(e, SUBMIT_SPELLING).splitlines()[:5] == [
        "would fail: scheduling: needs 4 eligible workers on one target, found 2", "",
        "local: 2 compatible local worker(s), the job needs 4 at once",
        "wkr-a: eligible, free now", "wkr-b: eligible, free now"]


def test_a_free_worker_is_eligible() -> None:
    e = explanation(make_job(), make_state(make_worker("wkr-a")))
    assert render(e, SUBMIT_SPELLING).splitlines() == ["would be placed now: assigned to wkr-a (CPU slot)", "",
                                                       "wkr-a: eligible, free now"]


@pytest.mark.parametrize(("seconds", "text"), [(4.21, "4.2s"), (187, "3m07s"), (7500, "2h05m")])
def test_elapsed_text(seconds: float, text: str) -> None:
    assert elapsed_text(seconds) == text


def test_a_framework_the_jobs_profile_asks_for_is_the_profiles_to_change() -> None:
    """`explain --profile pytorch-cuda` said 'drop --framework torch.cuda', a flag the user
    never gave."""
    from gpulayer.profiles import get_profile, resolve_requirements
    from gpulayer.specs import CommandJob, Requirements

    assert "torch.cuda" in get_profile("pytorch-cuda").frameworks
    job = CommandJob(command=["true"], requirements=resolve_requirements(Requirements(profile="pytorch-cuda")))
    worker = make_state(make_worker("wkr-1", devices=make_cuda_devices(1), frameworks={"torch": "2.3"}))
    said = render(explanation(job, worker), SUBMIT_SPELLING)
    assert "change --profile pytorch-cuda (it asks for torch.cuda) and 1 worker fits" in said, said
    assert "drop --framework" not in said
    assert "change profile='pytorch-cuda' (it asks for torch.cuda)" in render(explanation(job, worker), REMOTE_SPELLING)
    # without a profile, the job's own framework is the job's to drop
    own = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", frameworks=["torch.cuda"]))
    assert "drop --framework torch.cuda and 1 worker fits" in render(explanation(own, worker), SUBMIT_SPELLING)
