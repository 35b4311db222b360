"""The job state machine as pure functions: no database (tests/unit/test_control.py runs the
same rules through the control plane on SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from gpulayer.lifecycle import (
    OTHER_NODE_ENDED,
    JobView,
    TaskView,
    ended_with_its_group,
    must_end,
    release_unstarted,
    settle,
)
from gpulayer.records import JobError, JobState, TaskState

A, R, S, F, C, T, L = (TaskState.ASSIGNED, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED,
                       TaskState.CANCELLED, TaskState.TIMED_OUT, TaskState.LOST)


def job(state: JobState = JobState.RUNNING, attempt: int = 1, max_attempts: int = 1, cancel: bool = False) -> JobView:
    return JobView(state=state, attempt=attempt, max_attempts=max_attempts, cancel_requested=cancel)


def tasks(*states: TaskState, error: JobError | None = None) -> list[TaskView]:
    return [TaskView(id=f"t{i}", state=st, error=error if st in (F, L, T) else None) for i, st in enumerate(states)]


@pytest.mark.parametrize(("states", "expected"), [
    ((A,), JobState.ASSIGNED),
    ((A, A), JobState.ASSIGNED),
    ((R,), JobState.RUNNING),
    ((R, A), JobState.RUNNING),
    ((S, A), JobState.RUNNING),  # one node done, the other not started yet
    ((S,), JobState.SUCCEEDED),
    ((S, S, S), JobState.SUCCEEDED),
])
def test_without_a_bad_end_the_state_follows_the_nodes(states: tuple[TaskState, ...], expected: JobState) -> None:
    out = settle(job(), tasks(*states))
    assert out.state is expected and out.cancel == [] and not out.retry


def test_success_clears_the_error() -> None:
    out = settle(job(), tasks(S))
    assert out.state is JobState.SUCCEEDED and out.error is None


@pytest.mark.parametrize(("root", "final"), [(F, JobState.FAILED), (T, JobState.TIMED_OUT),
                                             (C, JobState.CANCELLED), (L, JobState.FAILED)])
def test_one_bad_end_ends_the_group_with_the_root_cause(root: TaskState, final: JobState) -> None:
    err = JobError(type="x", message="boom")
    out = settle(job(), tasks(root, S, error=err))
    assert out.state is final
    if root is L:
        assert out.error == JobError.lost("boom")
    elif root is not C:
        assert out.error == err


def test_unstarted_nodes_are_cancelled_and_running_ones_keep_the_job_running() -> None:
    out = settle(job(), tasks(F, A, R))
    assert out.cancel == ["t1"]
    assert out.state is JobState.RUNNING  # t2 is still being ended by its worker
    assert not out.retry
    assert OTHER_NODE_ENDED == "another node of the job ended"


def test_the_root_cause_is_not_a_node_cancelled_because_of_it() -> None:
    out = settle(job(), [TaskView("t0", C), TaskView("t1", T, JobError(type="timed_out", message="after 5 s"))])
    assert out.state is JobState.TIMED_OUT and out.error is not None and out.error.message == "after 5 s"


@pytest.mark.parametrize("root", [F, L])
def test_failed_or_lost_attempts_are_retried_while_attempts_last(root: TaskState) -> None:
    out = settle(job(attempt=1, max_attempts=2), tasks(root))
    assert out.state is JobState.QUEUED and out.retry
    assert out.note == f"attempt 1 {root.value}; 1 left"
    assert settle(job(attempt=2, max_attempts=2), tasks(root)).state is JobState.FAILED


@pytest.mark.parametrize("root", [T, C])
def test_timed_out_and_cancelled_attempts_are_not_retried(root: TaskState) -> None:
    assert not settle(job(attempt=1, max_attempts=5), tasks(root)).retry


def test_a_cancel_request_wins_over_retries() -> None:
    out = settle(job(attempt=1, max_attempts=5, cancel=True), tasks(F))
    assert out.state is JobState.CANCELLED and out.error == JobError.cancelled()


def test_the_root_cause_is_the_node_that_ended_badly_first_whatever_the_order_of_reports() -> None:
    # node 1 failed; node 0 was ended with its group (its worker reports only "cancelled", and
    # reports last); or node 0's launcher saw its peer go and failed a moment later
    raised = JobError.raised_by("ValueError", "bad", "Traceback ...")
    peer_gone = JobError(type="failed", message="exit code 1")
    for node0 in (TaskView("t0", C, JobError.cancelled(), ended_at=12.0),
                  TaskView("t0", F, peer_gone, ended_at=10.5)):
        out = settle(job(), [node0, TaskView("t1", F, raised, ended_at=10.0)])
        assert (out.state, out.error, out.root) == (JobState.FAILED, raised, "t1")
    # the same end time (or none recorded): node order
    out = settle(job(), [TaskView("t0", F, peer_gone, ended_at=3.0), TaskView("t1", F, raised, ended_at=3.0)])
    assert out.root == "t0"
    out = settle(job(), [TaskView("t0", L, JobError.lost("worker w0 is gone")), TaskView("t1", F, raised)])
    assert out.root == "t0" and out.error == JobError.lost("worker w0 is gone")


def test_a_retry_keeps_the_root_cause_as_the_job_s_error() -> None:
    raised = JobError.raised_by("ValueError", "bad", "Traceback ...")
    out = settle(job(max_attempts=2), [TaskView("t0", C, JobError.cancelled(), ended_at=2.0),
                                       TaskView("t1", F, raised, ended_at=1.0)])
    assert out.retry and out.state is JobState.QUEUED and out.error == raised


def test_a_node_reported_cancelled_ended_with_its_group_only_if_another_ended_badly() -> None:
    assert ended_with_its_group(job(), 1, [F]) and ended_with_its_group(job(), 1, [S, L])
    assert ended_with_its_group(job(), 1, [T])
    assert not ended_with_its_group(job(), 1, [R])  # a cancel of the one node: not the group's
    assert not ended_with_its_group(job(), 1, [C])
    assert not ended_with_its_group(job(cancel=True), 1, [F])  # the user's cancel
    assert not ended_with_its_group(job(attempt=2), 1, [F])  # a superseded attempt's node


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.SUCCEEDED, JobState.CANCELLED, JobState.UNSCHEDULABLE])
def test_queued_and_ended_jobs_are_left_alone(state: JobState) -> None:
    out = settle(job(state=state), tasks(F))
    assert out.state is None and out.cancel == []


def test_a_job_with_no_tasks_is_left_alone() -> None:
    assert settle(job(), []).state is None


def test_a_task_lost_before_it_started_gives_its_attempt_back() -> None:
    assert release_unstarted(job(max_attempts=1)) == 2
    assert release_unstarted(job(state=JobState.FAILED, max_attempts=1)) == 1


def ended(**kw: object) -> bool:
    base: dict[str, object] = dict(task_state=R, owner="w", reporter="w", attempt=1, job_state=JobState.RUNNING,
                                   job_attempt=1, cancel_requested=False, attempt_ended_badly=False)
    base.update(kw)
    return must_end(**base)  # type: ignore[arg-type]


def test_a_worker_keeps_a_task_its_job_still_wants() -> None:
    assert not ended()
    assert not ended(job_state=JobState.ASSIGNED)


@pytest.mark.parametrize("change", [
    {"task_state": L}, {"task_state": S}, {"owner": "other"}, {"cancel_requested": True},
    {"job_state": JobState.QUEUED}, {"job_state": JobState.CANCELLED}, {"job_state": None},
    {"attempt": 1, "job_attempt": 2}, {"attempt_ended_badly": True},
])
def test_a_worker_must_end_a_task_its_job_no_longer_wants(change: dict[str, object]) -> None:
    assert ended(**change)


@pytest.mark.parametrize(("view", "attempt", "accepted"), [
    (job(state=JobState.QUEUED, attempt=1), 1, True),  # waiting to be placed again
    (JobView(JobState.FAILED, 1, 1, error=JobError.lost("worker silent")), 1, True),  # ended by the loss
    (job(state=JobState.ASSIGNED, attempt=2), 1, False),  # attempt 2 superseded it
    (job(state=JobState.RUNNING, attempt=2), 1, False),
    (JobView(JobState.FAILED, 1, 1, error=JobError(type="failed", message="exit 1")), 1, False),
    (JobView(JobState.CANCELLED, 1, 1, error=JobError.cancelled()), 1, False),
])
def test_a_late_report_of_a_lost_task_counts_until_a_newer_attempt(view: JobView, attempt: int, accepted: bool) -> None:
    from gpulayer.lifecycle import late_report_accepted

    assert late_report_accepted(view, attempt, S) is accepted


@pytest.mark.parametrize("view", [
    job(state=JobState.QUEUED, attempt=1),
    JobView(JobState.FAILED, 1, 1, error=JobError.lost("worker silent")),
])
def test_a_late_report_that_a_lost_task_was_cancelled_never_counts(view: JobView) -> None:
    """Its worker ended it because the control plane said it was lost: no outcome of its own."""
    from gpulayer.lifecycle import late_report_accepted

    assert late_report_accepted(view, 1, TaskState.CANCELLED) is False
    assert late_report_accepted(view, 1, TaskState.FAILED) is True
