"""The control plane against real databases (SQLite files; PostgreSQL where reachable)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpulayer.control import ControlPlane, placement
from gpulayer.errors import Conflict, InvalidInput, NotFound
from gpulayer.records import JobError, JobState, TaskState
from gpulayer.specs import CommandJob, FunctionJob, Placement, Requirements
from gpulayer.store import Store
from tests.factories import Clock, cuda_caps, gpu_job, make_capabilities


def test_assign_start_finish_and_result(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(), origin="local", cpu_slots=0)
    job = cp.submit(gpu_job())
    assert job.state is JobState.ASSIGNED
    [a] = cp.poll_tasks(w.id)
    assert (a.job_id, a.accelerator, a.devices) == (job.id, "cuda", [0])
    cp.start_task(a.task_id, worker_id=w.id)
    assert cp.get_job(job.id).state is JobState.RUNNING
    cp.append_logs(a.task_id, worker_id=w.id, chunks=[("stdout", "hello\n"), ("stderr", "warn\n")])
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    done = cp.get_job(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert [(c.stream, c.data) for c in cp.logs(job.id)] == [("stdout", "hello\n"), ("stderr", "warn\n")]
    # a duplicate report changes nothing
    with pytest.raises(Conflict, match="already succeeded"):
        cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.FAILED, exit_code=1)
    assert cp.get_job(job.id).state is JobState.SUCCEEDED


def test_a_list_of_jobs_leaves_their_results_and_arguments_out_and_a_job_s_record_has_them(cp: ControlPlane) -> None:
    """A result or a function's arguments may be megabytes: a list of 50 jobs would read,
    parse and send all of them (bench/result_size.py --list)."""
    w = cp.register_worker(make_capabilities(), origin="local", cpu_slots=1)
    job = cp.submit(CommandJob(command=["true"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0, result={"rows": [1, 2]})
    [listed] = cp.list_jobs()
    assert (listed.id, listed.state, listed.exit_code, listed.result, listed.tasks) == \
        (job.id, JobState.SUCCEEDED, 0, None, [])
    assert listed.spec == cp.get_job(job.id).spec
    assert cp.get_job(job.id).result == {"rows": [1, 2]}
    assert cp.wait_jobs([job.id])[0].result == {"rows": [1, 2]}  # (a wait hands results back)
    # a brief wait too: what as_completed asks (it only hands out which ended)
    [brief] = cp.wait_jobs([job.id], brief=True)
    assert (brief.id, brief.state, brief.result, brief.tasks) == (job.id, JobState.SUCCEEDED, None, [])
    assert cp.wait_jobs([job.id])[0].tasks != []
    # nor a function's arguments (up to GPULAYER_MAX_ARGS_MB each)
    fn = cp.submit(FunctionJob(function="m:f", args=[{"rows": list(range(100))}], kwargs={"k": "v"}))
    [listed_fn] = [j for j in cp.list_jobs() if j.id == fn.id]
    assert (listed_fn.id, listed_fn.spec.function, listed_fn.spec.args, listed_fn.spec.kwargs) == (fn.id, "m:f", [], {})
    assert (cp.get_job(fn.id).spec.args, cp.get_job(fn.id).spec.kwargs) == ([{"rows": list(range(100))}], {"k": "v"})
    cp.cancel(fn.id)
    assert cp.wait_jobs([fn.id], brief=True)[0].spec.args == [] and cp.wait_jobs([fn.id])[0].spec.args != []


def test_compatible_but_busy_waits_then_runs(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    first = cp.submit(gpu_job())
    second = cp.submit(gpu_job())
    assert cp.get_job(second.id).state is JobState.QUEUED
    decision = cp.get_job(second.id).decision
    assert decision is not None and decision.outcome == "waiting"
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    assert cp.get_job(first.id).state is JobState.SUCCEEDED
    assert cp.get_job(second.id).state is JobState.ASSIGNED


def test_a_report_answers_what_the_slot_it_freed_was_given(cp: ControlPlane) -> None:
    """The worker starts its next task from its report's answer; its poll is not woken for
    it (it would only read the same), yet it still finds the task there until it starts."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    other = cp.register_worker(cuda_caps(1), cpu_slots=0)
    jobs = [cp.submit(gpu_job()) for _ in range(3)]  # one on each worker, the third queued
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    woken = cp._work_of(w.id)
    [nxt] = cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    assert nxt.job_id == jobs[2].id and (nxt.accelerator, nxt.devices) == ("cuda", [0])
    assert cp._work_of(w.id) == woken  # the poll of the worker answered was not woken
    assert [t.task_id for t in cp.poll_tasks(w.id)] == [nxt.task_id]
    # nothing queued behind it: the answer is empty
    [b] = cp.poll_tasks(other.id)
    cp.start_task(b.task_id, worker_id=other.id)
    assert cp.finish_task(b.task_id, worker_id=other.id, state=TaskState.SUCCEEDED, exit_code=0) == []


def test_a_freed_device_goes_to_the_first_job_that_fits_past_a_head_that_does_not(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass after a task ended reads the queue's head (2 jobs here), then a longer one."""
    monkeypatch.setattr(placement, "HEAD", 2)
    clock: Any = cp.clock
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)

    def submit(**kw: Any) -> str:
        clock.now += 1.0
        spec = CommandJob(command=["train"], **{"requirements": Requirements(accelerator="cuda", gpus=1), **kw})
        return cp.submit(spec).id

    first = submit()
    two_gpus = Requirements(accelerator="cuda", gpus=2)
    big = [submit(requirements=two_gpus, placement=Placement(on_unschedulable="wait")) for _ in range(5)]
    small = submit()
    urgent = submit(priority=5)
    assert {cp.get_job(j).state for j in [*big, small, urgent]} == {JobState.QUEUED}

    def finish_running() -> None:
        [a] = cp.poll_tasks(w.id)
        cp.start_task(a.task_id, worker_id=w.id)
        cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)

    finish_running()  # first's: the GPU goes to the job of highest priority
    assert cp.get_job(first).state is JobState.SUCCEEDED
    assert cp.get_job(urgent).state is JobState.ASSIGNED and cp.get_job(small).state is JobState.QUEUED
    finish_running()  # urgent's: to the first job that fits, behind five that never do
    assert cp.get_job(small).state is JobState.ASSIGNED
    assert {cp.get_job(j).state for j in big} == {JobState.QUEUED}


def test_a_worker_registered_again_with_other_devices_is_seen_by_the_next_pass(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=2),
                               placement=Placement(on_unschedulable="wait")))
    assert cp.get_job(job.id).state is JobState.QUEUED
    cp.heartbeat(w.id)  # a heartbeat alone changes nothing the pass decides on
    cp.schedule()
    assert cp.get_job(job.id).state is JobState.QUEUED
    cp.register_worker(cuda_caps(2), worker_id=w.id, cpu_slots=0)
    assert cp.get_job(job.id).state is JobState.ASSIGNED


def test_unschedulable_fails_or_waits_and_is_reevaluated_when_a_worker_joins(cp: ControlPlane) -> None:
    cpu = cp.register_worker(make_capabilities(), cpu_slots=1)
    failed = cp.submit(gpu_job())
    assert failed.state is JobState.UNSCHEDULABLE
    assert failed.decision is not None
    assert failed.decision.render() == (
        f"scheduling: no eligible worker\n{cpu.id}: needs 1 usable cuda device(s), worker has 0"
    )
    waiting = cp.submit(gpu_job(placement=Placement(on_unschedulable="wait")))
    assert waiting.state is JobState.QUEUED
    cp.register_worker(cuda_caps(), cpu_slots=0)
    assert cp.get_job(waiting.id).state is JobState.ASSIGNED


def test_silent_worker_is_offline_and_its_task_lost_then_retried(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w1 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=1))
    [a] = cp.poll_tasks(w1.id)
    cp.start_task(a.task_id, worker_id=w1.id)
    w2 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    clock.now += 5
    cp.heartbeat(w2.id)
    clock.now += 6  # w1 silent for 11 s > 10 s timeout; w2 heard from 6 s ago
    assert cp.expire_workers() == [w1.id]
    job = cp.get_job(job.id)
    assert [t.state for t in job.tasks] == [TaskState.LOST, TaskState.ASSIGNED]
    assert job.tasks[1].worker_id == w2.id and job.attempt == 2
    # the old attempt's late report is refused, never applied
    with pytest.raises(Conflict, match="late report"):
        cp.finish_task(a.task_id, worker_id=w1.id, state=TaskState.SUCCEEDED, exit_code=0)
    [b] = cp.poll_tasks(w2.id)
    cp.start_task(b.task_id, worker_id=w2.id)
    cp.finish_task(b.task_id, worker_id=w2.id, state=TaskState.SUCCEEDED, exit_code=0)
    assert cp.get_job(job.id).state is JobState.SUCCEEDED
    assert not cp.get_worker(w1.id).online


def test_lost_without_retries_left_fails_the_job(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job())
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    clock.now += 11
    cp.expire_workers()
    job = cp.get_job(job.id)
    assert job.state is JobState.FAILED
    assert job.error is not None and job.error.type == "lost"


def test_heartbeat_tells_the_worker_which_tasks_to_end(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2)
    job = cp.submit(CommandJob(command=["sleep", "100"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    assert cp.heartbeat(w.id, running=[a.task_id]).cancel == []
    cp.cancel(job.id)
    assert cp.get_job(job.id).state is JobState.RUNNING  # until the worker has ended it
    assert cp.heartbeat(w.id, running=[a.task_id]).cancel == [a.task_id]
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.CANCELLED, exit_code=-15)
    assert cp.get_job(job.id).state is JobState.CANCELLED
    assert cp.heartbeat("wkr-unknown", running=[]).known is False


def test_cancel_of_a_queued_job_and_bad_ids(cp: ControlPlane) -> None:
    cp.register_worker(cuda_caps(1), cpu_slots=0)
    cp.submit(gpu_job())
    queued = cp.submit(gpu_job())
    assert cp.cancel(queued.id).state is JobState.CANCELLED
    with pytest.raises(NotFound, match="no such job"):
        cp.cancel("job-nope")
    with pytest.raises(InvalidInput, match="expected one of"):
        cp.list_jobs(state="sleeping")


def test_idempotent_submit_makes_one_job(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=1)
    a = cp.submit(CommandJob(command=["true"]), idempotency_key="k-1")
    b = cp.submit(CommandJob(command=["true"]), idempotency_key="k-1")
    assert a.id == b.id
    assert len(cp.list_jobs()) == 1


def test_draining_worker_hands_back_unstarted_tasks_without_spending_retries(cp: ControlPlane) -> None:
    w1 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(placement=Placement(on_unschedulable="wait")))
    cp.drain_worker(w1.id)
    assert cp.get_job(job.id).state is JobState.QUEUED
    w2 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    [a] = cp.poll_tasks(w2.id)
    assert a.job_id == job.id
    assert cp.get_job(job.id).tasks[0].state is TaskState.LOST
    assert cp.get_job(job.id).attempt == 2  # a new attempt, although the job has no retries


# --------------------------------------------------------------------------- property: lifecycle


class Lifecycle(RuleBasedStateMachine):
    """Random joins, leaves, heartbeats, starts and completions; invariants hold throughout."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.clock = Clock()
        self.cp = ControlPlane(Store(f"sqlite:///{self.dir.name}/p.db"), heartbeat_timeout=10.0, clock=self.clock)
        self.workers: list[str] = []
        self.jobs: list[str] = []

    def teardown(self) -> None:
        self.cp.store.dispose()
        self.dir.cleanup()

    @rule(gpus=st.integers(0, 3), slots=st.integers(0, 2))
    def join(self, gpus: int, slots: int) -> None:
        self.workers.append(self.cp.register_worker(cuda_caps(gpus), cpu_slots=slots).id)

    @precondition(lambda self: self.workers)
    @rule(i=st.integers(0, 20))
    def leave(self, i: int) -> None:
        self.cp.deregister_worker(self.workers[i % len(self.workers)])

    @rule(gpus=st.integers(0, 2), retries=st.integers(0, 2), wait=st.booleans())
    def submit(self, gpus: int, retries: int, wait: bool) -> None:
        req = Requirements(accelerator="cuda", gpus=gpus) if gpus else Requirements()
        job = self.cp.submit(CommandJob(command=["x"], requirements=req, retries=retries,
                                        placement=Placement(on_unschedulable="wait" if wait else "fail")))
        self.jobs.append(job.id)

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        for w in self.workers:
            if self.cp.get_worker(w).online and seconds < 6:
                self.cp.heartbeat(w)
        self.cp.expire_workers()

    @precondition(lambda self: self.workers)
    @rule(i=st.integers(0, 20), outcome=st.sampled_from(["succeeded", "failed", "timed_out"]))
    def work(self, i: int, outcome: str) -> None:
        w = self.workers[i % len(self.workers)]
        for a in self.cp.poll_tasks(w):
            try:
                self.cp.start_task(a.task_id, worker_id=w)
                self.cp.finish_task(a.task_id, worker_id=w, state=outcome, exit_code=0 if outcome == "succeeded" else 1)
            except Conflict:
                pass

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        self.cp.cancel(self.jobs[i % len(self.jobs)])

    @invariant()
    def consistent(self) -> None:
        with self.cp.store.read() as s:
            from sqlmodel import select

            from gpulayer.store import JobRow, TaskRow

            tasks = s.exec(select(TaskRow)).all()
            jobs = {j.id: j for j in s.exec(select(JobRow)).all()}
        active = [t for t in tasks if t.state in ("assigned", "running")]
        grants = [(t.worker_id, d) for t in active for d in json.loads(t.devices)]
        assert len(grants) == len(set(grants)), "a device granted twice"
        for t in active:
            job = jobs[t.job_id]
            assert t.attempt == job.attempt, "an active task of a superseded attempt"
            assert not JobState(job.state).terminal, "a terminal job with an active task"
        for job in jobs.values():
            mine = [t for t in tasks if t.job_id == job.id and t.attempt == job.attempt]
            if job.state in ("assigned", "running"):
                assert mine and any(t.state in ("assigned", "running") for t in mine)
            if job.state == "succeeded":
                assert mine and all(t.state == "succeeded" for t in mine)
            assert job.attempt <= job.max_attempts


TestLifecycle = Lifecycle.TestCase
TestLifecycle.settings = settings(max_examples=12, stateful_step_count=20, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- found in review


def test_a_failed_node_keeps_its_siblings_devices_busy_until_they_have_ended(cp: ControlPlane) -> None:
    from gpulayer.specs import DistributedJob

    w1 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    w2 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    gang = cp.submit(DistributedJob(nodes=2, entry="train.py", requirements=Requirements(accelerator="cuda")))
    tasks = {w: cp.poll_tasks(w)[0] for w in (w1.id, w2.id)}
    for w, a in tasks.items():
        cp.start_task(a.task_id, worker_id=w)
    waiting = cp.submit(gpu_job(placement=Placement(on_unschedulable="wait")))
    failed_node = next(w for w, a in tasks.items() if a.node_rank == 1)
    other = w1.id if failed_node == w2.id else w2.id
    raised = JobError.raised_by("RuntimeError", "rank 1 failing", "Traceback ...")
    cp.finish_task(tasks[failed_node].task_id, worker_id=failed_node, state=TaskState.FAILED, exit_code=3,
                   error=raised)
    # the other node still runs: its GPU is not handed out, and the job is not decided yet
    assert cp.get_job(gang.id).state is JobState.RUNNING
    assert [a.job_id for a in cp.poll_tasks(other)] == []
    assert cp.heartbeat(other, running=[tasks[other].task_id]).cancel == [tasks[other].task_id]
    # its worker ended it (SIGTERM) and knows only that it was told to
    cp.finish_task(tasks[other].task_id, worker_id=other, state=TaskState.CANCELLED, exit_code=-15,
                   error=JobError.cancelled())
    done = cp.get_job(gang.id)
    # the root cause's state, error and exit code, not those of the sibling that reported last
    on_node = raised.model_copy(update={"message": f"node 1 (worker {failed_node}): rank 1 failing"})
    assert (done.state, done.error, done.exit_code) == (JobState.FAILED, on_node, 3)
    assert sorted(t.state.value for t in done.tasks) == ["cancelled", "failed"]
    sibling = next(t for t in done.tasks if t.node_rank == 0)
    assert sibling.error == JobError.cancelled("another node of the job ended")
    assert cp.get_job(waiting.id).state is JobState.ASSIGNED


def test_a_group_s_error_names_the_node_and_the_worker_it_ended_because_of(cp: ControlPlane) -> None:
    # the job's error was the node's alone: "launcher 'torchrun' is not installed on this
    # worker", "exit code 1", with nothing to say which of the nodes (and so which worker)
    from gpulayer.specs import DistributedJob

    workers = [cp.register_worker(make_capabilities(), cpu_slots=1).id for _ in range(3)]
    gang = cp.submit(DistributedJob(nodes=3, entry="train.py"))
    tasks = {t.node_rank: t for t in cp.get_job(gang.id).tasks}
    assert sorted(t.worker_id for t in tasks.values()) == sorted(workers)
    for t in (tasks[0], tasks[1]):
        cp.start_task(t.id, worker_id=t.worker_id)
    why = "launcher 'torchrun' is not installed on this worker (installed: none)"
    cp.finish_task(tasks[2].id, worker_id=tasks[2].worker_id, state=TaskState.FAILED, error=JobError.launcher(why))
    for t in (tasks[0], tasks[1]):
        cp.finish_task(t.id, worker_id=t.worker_id, state=TaskState.CANCELLED, exit_code=-15,
                       error=JobError.cancelled())
    done = cp.get_job(gang.id)
    assert done.state is JobState.FAILED
    assert done.error == JobError.launcher(f"node 2 (worker {tasks[2].worker_id}): {why}")
    assert done.error.describe() == f"launcher: node 2 (worker {tasks[2].worker_id}): {why}"
    # the task keeps its own words; a one-node job's error is its task's, as before
    assert next(t for t in done.tasks if t.node_rank == 2).error == JobError.launcher(why)
    single = cp.submit(CommandJob(command=["true"]))
    [a] = [t for t in cp.get_job(single.id).tasks]
    cp.start_task(a.id, worker_id=a.worker_id)
    cp.finish_task(a.id, worker_id=a.worker_id, state=TaskState.FAILED, exit_code=1,
                   error=JobError.ended(TaskState.FAILED, "exit code 1"))
    assert cp.get_job(single.id).error == JobError.ended(TaskState.FAILED, "exit code 1")


def test_a_group_whose_worker_died_ends_lost_though_the_peer_it_cut_off_failed_before_it_was_found(
        cp: ControlPlane) -> None:
    # a remote worker killed: its peer's rank fails at once (gloo: connection closed by peer,
    # exit 1), but the loss is only found a heartbeat timeout later, so the peer's failure
    # came first and the job ended "failed: exit code 1" instead of the worker's loss
    from gpulayer.specs import DistributedJob

    clock: Clock = cp.clock  # type: ignore[assignment]
    for _ in range(2):
        cp.register_worker(make_capabilities(), cpu_slots=1)
    gang = cp.submit(DistributedJob(nodes=2, entry="train.py"))
    tasks = {t.node_rank: t for t in cp.get_job(gang.id).tasks}
    for t in tasks.values():
        cp.start_task(t.id, worker_id=t.worker_id)
    dead, peer = tasks[0], tasks[1]
    clock.now += 2  # node 0's worker dies; node 1's rank loses its connection to it
    cp.heartbeat(peer.worker_id, running=[peer.id])
    cp.finish_task(peer.id, worker_id=peer.worker_id, state=TaskState.FAILED, exit_code=1,
                   error=JobError.ended(TaskState.FAILED, "exit code 1"))
    for step in (3, 3, 3):  # (steps under half the timeout: a longer one is taken for a pause)
        clock.now += step
        cp.heartbeat(peer.worker_id)
    assert cp.expire_workers() == [dead.worker_id]
    done = cp.get_job(gang.id)
    assert done.state is JobState.FAILED
    assert done.error == JobError.lost(f"node 0 (worker {dead.worker_id}): worker {dead.worker_id} "
                                       "stopped sending heartbeats"), done.error
    lost = next(t for t in done.tasks if t.node_rank == 0)
    assert lost.state is TaskState.LOST and lost.ended_at is not None and lost.ended_at < clock.now


def test_a_running_task_its_worker_no_longer_reports_is_lost(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=1))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    clock.now += 5
    cp.heartbeat(w.id, running=[])  # within the grace: a report may be on its way
    assert cp.get_job(job.id).tasks[0].state is TaskState.RUNNING
    clock.now += 2 * cp.heartbeat_timeout
    cp.heartbeat(w.id, running=[])
    job = cp.get_job(job.id)
    assert job.tasks[0].state is TaskState.LOST
    assert job.attempt == 2 and job.tasks[1].state is TaskState.ASSIGNED  # retried


def test_cancelling_an_assigned_job_lets_a_queued_one_run_at_once(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    first = cp.submit(gpu_job())
    second = cp.submit(gpu_job())
    assert cp.get_job(second.id).state is JobState.QUEUED
    cp.cancel(first.id)
    assert [a.job_id for a in cp.poll_tasks(w.id)] == [second.id]


def test_a_bundle_uploaded_twice_is_stored_once(cp: ControlPlane) -> None:
    import hashlib

    data = b"PK\x05\x06" + b"\x00" * 18
    digest = hashlib.sha256(data).hexdigest()
    assert cp.put_bundle(digest, data).stored is True
    assert cp.put_bundle(digest, data).stored is False
    assert cp.get_bundle(digest) == data


def test_rendezvous_ports_stay_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer.control.placement import rendezvous_port as _rendezvous_port

    assert all(20000 <= _rendezvous_port() <= 32767 for _ in range(500))
    monkeypatch.setenv("GPULAYER_RENDEZVOUS_PORTS", "25000-25001")
    assert {_rendezvous_port() for _ in range(200)} == {25000, 25001}
    monkeypatch.setenv("GPULAYER_RENDEZVOUS_PORTS", "80-90")
    with pytest.raises(InvalidInput, match="GPULAYER_RENDEZVOUS_PORTS"):
        _rendezvous_port()


def test_a_rendezvous_port_is_one_no_running_group_at_that_address_holds(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    # the port was drawn at random: two groups whose rank 0 ran on one machine could get the
    # same one (with a narrow GPULAYER_RENDEZVOUS_PORTS, most times), and the second's torchrun
    # failed with EADDRINUSE or met the first group's store; a retry could get its last port
    from gpulayer.specs import DistributedJob

    monkeypatch.setenv("GPULAYER_RENDEZVOUS_PORTS", "25000-25001")
    for _ in range(2):
        cp.register_worker(make_capabilities(), cpu_slots=2)
    gangs = [cp.submit(DistributedJob(nodes=2, entry="train.py", retries=1)) for _ in range(2)]
    ports = [cp.get_job(g.id).tasks[0].rendezvous.master_port for g in gangs]  # type: ignore[union-attr]
    assert sorted(ports) == [25000, 25001]
    # the first group's retry: the other port is held by the second group, and its own last
    # one may still be held by what a lost node left running: a third is free
    first = cp.get_job(gangs[0].id)
    for t in first.tasks:
        cp.start_task(t.id, worker_id=t.worker_id)
    monkeypatch.setenv("GPULAYER_RENDEZVOUS_PORTS", "25000-25002")
    for t in first.tasks:
        cp.finish_task(t.id, worker_id=t.worker_id, state=TaskState.FAILED, exit_code=1)
    retried = cp.get_job(gangs[0].id)
    assert retried.attempt == 2
    assert {t.rendezvous.master_port for t in retried.tasks if t.attempt == 2} == {25002}  # type: ignore[union-attr]


def test_a_decision_that_cannot_be_read_is_rewritten(cp: ControlPlane) -> None:
    from gpulayer.store import JobRow

    cp.register_worker(make_capabilities(), cpu_slots=0)
    job = cp.submit(gpu_job(placement=Placement(on_unschedulable="wait")))
    with cp.store.write() as s:
        row = s.get(JobRow, job.id)
        assert row is not None
        row.decision = "{not json"
        s.add(row)
    assert cp.get_job(job.id).decision is None  # unreadable, but the job still reads
    cp.schedule()
    decision = cp.get_job(job.id).decision
    assert decision is not None and decision.outcome == "unschedulable"


def test_a_retry_whose_only_worker_died_waits_for_a_worker_instead_of_failing(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=1))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    clock.now += 11  # silent for longer than the timeout: offline, task lost, job retried
    assert cp.expire_workers() == [w.id]
    queued = cp.get_job(job.id)
    assert queued.state is JobState.QUEUED and queued.attempt == 1
    assert queued.decision is not None and queued.decision.outcome == "waiting"
    assert queued.decision.summary == "waiting for a worker: attempt 1 ran, but no eligible worker"
    w2 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    [b] = cp.poll_tasks(w2.id)
    assert b.job_id == job.id and b.attempt == 2


def test_a_job_back_in_the_queue_has_no_exit_code_its_failed_attempt_s_task_keeps_it(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=1))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.FAILED, exit_code=-15)
    again = cp.get_job(job.id)
    assert again.attempt == 2 and again.state is JobState.ASSIGNED  # (placed again at once)
    assert (again.exit_code, again.tasks[0].exit_code) == (None, -15)  # ('queued (exit code -15)' read as the job's)


def test_prune_forgets_offline_workers_and_revokes_their_credentials(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    join = cp.create_token(scope="join")
    gone = cp.join_worker(make_capabilities(), join_token=join.token)
    alive = cp.register_worker(make_capabilities(), cpu_slots=1)
    clock.now += 5
    cp.heartbeat(alive.id)
    clock.now += 6  # `gone` silent for 11 s > 10 s
    cp.expire_workers()
    assert cp.prune_workers(older_than=3600) == []  # silent for less than an hour
    assert cp.prune_workers() == [gone.worker_id]
    assert [w.id for w in cp.list_workers()] == [alive.id]
    assert next(t for t in cp.list_tokens() if t.id == gone.token_id).revoked


def test_a_worker_whose_credential_is_revoked_is_offline_at_once_and_its_work_goes_elsewhere(cp: ControlPlane) -> None:
    """It can no longer report: left online, it got new jobs until it went silent for the
    heartbeat timeout, and each waited that long to be placed again."""
    join = cp.create_token(scope="join", ttl=3600)
    revoked = cp.join_worker(make_capabilities(), join_token=join.token, cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"], placement=Placement(target="remote", on_unschedulable="wait")))
    assert [a.job_id for a in cp.poll_tasks(revoked.worker_id)] == [job.id]  # handed out, not started
    cp.revoke_token(revoked.token_id)
    [w] = [w for w in cp.list_workers() if w.id == revoked.worker_id]
    assert not w.online
    again = cp.get_job(job.id)
    assert again.state is JobState.QUEUED and again.attempt == 1 and again.tasks[0].state is TaskState.LOST
    assert again.tasks[0].error is not None and again.tasks[0].error.message == (
        "its credential was revoked (never started)")
    other = cp.join_worker(make_capabilities(), join_token=join.token, cpu_slots=1)
    assert [a.job_id for a in cp.poll_tasks(other.worker_id)] == [job.id]  # at once, on the worker left
    assert cp.revoke_token(revoked.token_id).revoked  # (again: nothing more to do)


def test_a_dead_in_process_worker_leaves_no_row(cp: ControlPlane) -> None:
    import socket
    import subprocess
    import sys

    from gpulayer.control import IN_PROCESS_NAME

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone, on this host
    w = cp.register_worker(make_capabilities(hostname=socket.gethostname()), cpu_slots=1, name=IN_PROCESS_NAME,
                           pid=proc.pid)
    job = cp.submit(CommandJob(command=["x"], retries=1))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    assert cp.expire_workers() == [w.id]  # noticed at once: its pid is gone
    assert cp.list_workers() == []
    lost = cp.get_job(job.id)
    assert lost.tasks[0].state is TaskState.LOST and lost.tasks[0].error is not None
    assert lost.tasks[0].error.message == f"worker {w.id} (pid {proc.pid}) is gone"


def test_live_local_workers_are_the_online_alive_undrained_local_ones(cp: ControlPlane) -> None:
    import os
    import socket
    import subprocess
    import sys

    clock: Clock = cp.clock  # type: ignore[assignment]
    here = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone, on this host
    alive = cp.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=os.getpid())
    gone = cp.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=proc.pid)
    drained = cp.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=os.getpid())
    cp.drain_worker(drained.id)
    killed_while_draining = cp.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=proc.pid)
    cp.drain_worker(killed_while_draining.id)
    joined = cp.join_worker(make_capabilities(), join_token=cp.create_token(scope="join").token)
    silent = cp.register_worker(make_capabilities(hostname="elsewhere"), cpu_slots=1)
    assert sorted(cp.live_local_workers()) == sorted([alive.id, silent.id])
    # the dead ones were marked offline, as an expiry pass would (get_worker runs none itself)
    assert not cp.get_worker(gone.id).online and not cp.get_worker(killed_while_draining.id).online
    assert cp.get_worker(drained.id).online
    clock.now += 5
    cp.heartbeat(alive.id)
    cp.heartbeat(joined.worker_id)
    clock.now += 6  # `silent` has been silent for 11 s > 10 s
    assert cp.live_local_workers() == [alive.id]
    assert not cp.get_worker(silent.id).online


def _a_lost_task(cp: ControlPlane, retries: int) -> tuple[Any, Any, Any]:
    """A worker with one GPU job's task started, then silent past its timeout: (worker, job, task)."""
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=retries))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    clock.now += 11
    cp.expire_workers()
    return w, job, a


@pytest.mark.parametrize("retries", [0, 1])
def test_a_report_after_a_loss_is_accepted_until_a_newer_attempt_runs(cp: ControlPlane, retries: int) -> None:
    """The worker was only cut off (a server restart, a partition): the command ran once and
    exited 0, so the job succeeds instead of ending lost or running twice."""
    w, job, a = _a_lost_task(cp, retries)
    lost = cp.get_job(job.id)
    assert lost.state is (JobState.QUEUED if retries else JobState.FAILED)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    done = cp.get_job(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert [t.state for t in done.tasks] == [TaskState.SUCCEEDED]
    assert "late_report_accepted" in [e.kind for e in cp.events(job.id)]


@pytest.mark.parametrize("retries", [0, 1])
def test_a_lost_task_its_worker_ended_when_told_does_not_cancel_the_job(cp: ControlPlane, retries: int) -> None:
    """The worker was cut off and its task lost; back (and stopping, so no retry is placed on
    it), it hears that the task must end, ends it and reports it cancelled. Nobody cancelled
    the job: it is retried as it allows, or stays lost."""
    w, job, a = _a_lost_task(cp, retries)
    cp.drain_worker(w.id)
    assert cp.heartbeat(w.id, running=[a.task_id]).cancel == [a.task_id]
    with pytest.raises(Conflict):
        cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.CANCELLED, exit_code=-15,
                       error=JobError.cancelled())
    after = cp.get_job(job.id)
    assert after.state is (JobState.QUEUED if retries else JobState.FAILED), after
    assert after.error is not None and after.error.type == "lost"
    assert [t.state for t in after.tasks] == [TaskState.LOST]


def test_a_report_after_a_loss_is_refused_once_a_retry_was_placed(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w1 = cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(retries=1))
    [a] = cp.poll_tasks(w1.id)
    cp.start_task(a.task_id, worker_id=w1.id)
    clock.now += 11
    cp.expire_workers()
    cp.register_worker(cuda_caps(1), cpu_slots=0)  # attempt 2 is placed on it
    assert cp.get_job(job.id).attempt == 2
    with pytest.raises(Conflict, match="late report"):
        cp.finish_task(a.task_id, worker_id=w1.id, state=TaskState.SUCCEEDED, exit_code=0)


def test_after_a_server_start_silence_counts_for_nothing_for_one_timeout(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    clock.now += 30  # heard nothing for long: the server was down
    cp.begin_grace()
    clock.now += 9
    assert cp.expire_workers() == []  # within the grace (10 s)
    cp.seen([w.id])  # any call of the worker counts
    clock.now += 9
    assert cp.expire_workers() == []
    clock.now += 2  # grace over, and silent for 11 s since that call
    assert cp.expire_workers() == [w.id]


def test_a_late_call_of_a_worker_that_left_does_not_bring_it_back(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    cp.deregister_worker(w.id)
    cp.seen([w.id])  # e.g. its last log flush arrived after it left
    assert cp.get_worker(w.id).online is False
    cp.submit(CommandJob(command=["x"], placement=Placement(target="local", on_unschedulable="wait")))
    assert cp.poll_tasks(w.id) == []


def test_a_heartbeat_heard_before_its_worker_left_and_written_after_does_not_bring_it_back(cp: ControlPlane) -> None:
    """A server answers an idle worker's heartbeat at once and writes it within 0.25 s: a
    worker that left in between stays gone (its next heartbeat goes the long way), one that
    had only gone silent is online again."""
    stays, leaves, silent = (cp.register_worker(make_capabilities(), cpu_slots=1).id for _ in range(3))
    cp.clock.now += 11  # type: ignore[attr-defined]  # past the timeout: all three silent
    cp.heartbeats({stays: []})  # (which looks for silent workers too)
    cp.expire_workers()
    assert [cp.get_worker(w).online for w in (stays, leaves, silent)] == [True, False, False]
    heard_at = cp.clock()
    cp.deregister_worker(leaves)
    assert cp.heartbeats_heard({stays: heard_at, leaves: heard_at, silent: heard_at, "wkr-gone": heard_at}) == {
        leaves, "wkr-gone"}
    assert cp.get_worker(leaves).online is False
    assert [(cp.get_worker(w).online, cp.get_worker(w).last_heartbeat) for w in (stays, silent)] == [(True, heard_at)] * 2


def test_a_heartbeat_written_after_its_worker_left_does_not_bring_it_back_and_ends_what_it_ran(
        cp: ControlPlane) -> None:
    """The long way too (a worker that runs a task): a stopping worker's heartbeat, sent
    before it deregistered and written after (retried, or in a server's batch), had it online
    and draining for good (CI: `worker list` said draining after the worker exited). A silent
    worker that had not left still comes back."""
    leaves, silent = (cp.register_worker(make_capabilities(), cpu_slots=1).id for _ in range(2))
    cp.submit(CommandJob(command=["sleep", "100"]))
    [a] = cp.poll_tasks(leaves)
    cp.start_task(a.task_id, worker_id=leaves)
    cp.deregister_worker(leaves)
    cp.clock.now += 11  # type: ignore[attr-defined]  # past the timeout: the other one is silent
    cp.expire_workers()
    replies = cp.heartbeats({leaves: [a.task_id], silent: []})
    assert (replies[leaves].known, replies[leaves].cancel) == (True, [a.task_id])
    assert [(cp.get_worker(w).online, cp.get_worker(w).draining) for w in (leaves, silent)] == [
        (False, True), (True, False)]


def _counting_reads(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    read = cp.store.read

    def counted():  # type: ignore[no-untyped-def]
        reads[0] += 1
        return read()

    monkeypatch.setattr(cp.store, "read", counted)
    return reads


def test_the_poll_after_one_that_returned_tasks_waits_before_it_looks(cp: ControlPlane,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2)
    a = cp.submit(CommandJob(command=["a"]))
    [ta] = cp.poll_work(w.id, wait=0.05).tasks
    assert ta.job_id == a.id
    reads = _counting_reads(cp, monkeypatch)
    assert cp.poll_work(w.id, running=[ta.task_id], wait=0.05).tasks == []
    if cp.store.nudges is not None:
        # nothing new since (and another process's change would nudge this one): it waits,
        # and looks once when its wait ends, not before too
        assert reads[0] == 1
    else:  # (PostgreSQL: another process's change is seen only by looking)
        assert reads[0] == 2


def test_the_poll_after_one_that_returned_tasks_still_sees_what_came_since(cp: ControlPlane,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2)
    cp.submit(CommandJob(command=["a"]))
    [ta] = cp.poll_work(w.id, wait=0.05).tasks
    b = cp.submit(CommandJob(command=["b"]))  # placed on the worker before its next poll
    waits: list[float] = []
    wait_work = cp._wait_work
    monkeypatch.setattr(cp, "_wait_work", lambda *a: (waits.append(a[-1]), wait_work(*a))[1])
    [tb] = cp.poll_work(w.id, running=[ta.task_id], wait=600).tasks
    assert tb.job_id == b.id and waits == []  # at once: it looked first
    # a worker that did not get an answer (its tasks are not among those it runs) gets it again
    again = cp.poll_work(w.id, running=[], wait=600).tasks
    assert {t.task_id for t in again} == {ta.task_id, tb.task_id}


def test_log_chunks_reach_the_observers_but_wake_no_wait_for_a_job(cp: ControlPlane, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A task that writes fast ships a chunk every few milliseconds; a wait for its job looks
    at the job again only when a job or task changed (here: its end), and a server's
    dashboard (an observer) still hears of every chunk, as output, not as a change."""
    import threading

    from gpulayer.control import ControlObserver
    from gpulayer.control import jobs as control_jobs

    heard: list[str] = []

    class Dashboard(ControlObserver):
        def on_change(self) -> None:
            heard.append("change")

        def on_progress(self, job_id: str, *, output: bool) -> None:
            heard.append(f"{job_id} {'output' if output else 'started'}")

    cp.observe(Dashboard())
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    heard.clear()
    cp.start_task(a.task_id, worker_id=w.id)
    assert heard == [f"{job.id} started"]  # (no change: what lists show it running by)
    looks: list[str] = []
    job_state = control_jobs.plain.job_state

    def counted(s, job_id):  # type: ignore[no-untyped-def]
        looks.append(job_id)
        return job_state(s, job_id)

    monkeypatch.setattr(control_jobs.plain, "job_state", counted)
    waited: list[JobState] = []
    waiter = threading.Thread(target=lambda: waited.append(cp.wait_job(job.id, timeout=60).state))
    waiter.start()
    heard.clear()
    for i in range(200):
        cp.append_logs(a.task_id, worker_id=w.id, chunks=[("stdout", f"{i}\n")])
    assert heard == [f"{job.id} output"] * 200
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    waiter.join(60)
    assert waited == [JobState.SUCCEEDED]
    # its first look, the looks its own timer spaces out (0.05 s, growing) and the last one;
    # each of the 200 chunks woke it to look before
    assert len(looks) < 50, len(looks)
    assert "".join(c.data for c in cp.logs(job.id)) == "".join(f"{i}\n" for i in range(200))


def test_a_spec_stored_before_a_check_was_added_is_still_read(cp: ControlPlane) -> None:
    """Checks added to the specs (a label key with '=', an empty program) ran on every stored
    spec read too: one job stored before them broke every list and placement pass for good."""
    job = cp.submit(CommandJob(command=["true"], requirements=Requirements(labels={"zone": "a"}),
                               placement=Placement(target="remote", on_unschedulable="wait")))
    with cp.store.write() as s:
        from gpulayer.store import plain

        spec = json.loads(plain.job(s, job.id).spec)
        spec["requirements"]["labels"] = {"zone=a": "1"}
        spec["requirements"]["os"] = ""  # (an empty OS, refused since: it read as any)
        spec["command"] = ["", "x"]
        spec["name"] = " "  # (an empty name, refused since: it listed as nothing)
        plain.update_job(s, job.id, spec=json.dumps(spec))
    assert [j.id for j in cp.list_jobs()] == [job.id]
    cp.schedule_queue()
    assert cp.get_job(job.id).spec.command == ["", "x"]  # type: ignore[union-attr]
    assert cp.get_job(job.id).spec.requirements.os is None
    assert cp.get_job(job.id).spec.name is None


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_job_name_is_refused(name: str) -> None:
    """A name of nothing was stored, and the job listed and showed with no name at all."""
    from gpulayer.errors import InvalidInput

    with pytest.raises(InvalidInput) as e:
        CommandJob(command=["true"], name=name)
    assert str(e.value) == (f"CommandJob(name={name!r}): empty; accepted: a name of text (leave it out for a job "
                            "without a name)")


def test_an_empty_function_python_is_refused_and_a_stored_one_still_reads(cp: ControlPlane) -> None:
    """FunctionJob(python='') was taken and ran the worker's own Python (a
    python=os.environ.get(...) with the variable unset), saying nothing."""
    from gpulayer.errors import InvalidInput

    with pytest.raises(InvalidInput) as e:
        FunctionJob(function="m:f", python="")
    assert str(e.value) == ("FunctionJob(python=''): empty; accepted: the path of a Python interpreter on the "
                            "worker (leave it out for the worker's job Python)")
    job = cp.submit(FunctionJob(function="m:f", python="/usr/bin/python3",
                                placement=Placement(target="remote", on_unschedulable="wait")))
    with cp.store.write() as s:
        from gpulayer.store import plain

        spec = json.loads(plain.job(s, job.id).spec)
        spec["python"] = ""  # (stored before the check)
        plain.update_job(s, job.id, spec=json.dumps(spec))
    assert [j.id for j in cp.list_jobs()] == [job.id]
    assert cp.get_job(job.id).spec.python is None  # type: ignore[union-attr]
