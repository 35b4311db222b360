"""Batch submission: ``ControlPlane.submit_many`` (one transaction, one placement pass, all
or nothing, idempotent as a whole), ``Client.submit_many`` (prepared once, split into calls),
``gl.submit_many`` and ``RemoteFunction.map``. The HTTP route is tested against a real
server in tests/integration/test_server_api.py."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.control import ControlPlane
from gpulayer.control import jobs as control_jobs
from gpulayer.errors import Conflict, InvalidArgument, InvalidInput, Unschedulable
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, FunctionJob, Placement, Requirements
from tests.factories import cuda_caps, gpu_job, make_capabilities
from tests.support import job_module

WAIT = Placement(on_unschedulable="wait")


def ids(records: list[Any]) -> list[str]:
    return [r.id for r in records]


def stored_ids(cp: ControlPlane) -> set[str]:
    return {j.id for j in cp.list_jobs(limit=1000)}


# --------------------------------------------------------------------------- the control plane


def test_the_records_come_back_in_order_one_per_spec(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)  # nothing runs: all stay queued
    specs = [CommandJob(command=["echo", str(i)], placement=WAIT, name=f"n{i}") for i in range(7)]
    records = cp.submit_many(specs)
    assert [r.spec.command for r in records] == [["echo", str(i)] for i in range(7)]  # type: ignore[union-attr]
    assert [r.spec.name for r in records] == [f"n{i}" for i in range(7)]
    assert len(set(ids(records))) == 7
    assert stored_ids(cp) == set(ids(records))
    assert all(cp.get_job(r.id).state is JobState.QUEUED for r in records)


def test_one_pass_assigns_as_many_as_fit_and_the_rest_wait(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(3), cpu_slots=0)
    records = cp.submit_many([gpu_job() for _ in range(5)])
    states = [r.state for r in records]
    assert states.count(JobState.ASSIGNED) == 3 and states.count(JobState.QUEUED) == 2
    for r in records:
        assert r.decision is not None
        assert r.decision.outcome == ("assigned" if r.state is JobState.ASSIGNED else "waiting")
    tasks = cp.poll_tasks(w.id)
    assert sorted(d for a in tasks for d in a.devices) == [0, 1, 2]  # one device each, none shared
    assert {a.job_id for a in tasks} == {r.id for r in records if r.state is JobState.ASSIGNED}


def test_the_jobs_of_a_batch_are_placed_in_the_order_given(cp: ControlPlane) -> None:
    """First in, first placed within a batch as between single submits: with 2 free devices
    and 10 equal jobs, jobs 0 and 1 run and 2..9 wait."""
    cp.register_worker(cuda_caps(2), cpu_slots=0)
    records = cp.submit_many([gpu_job(name=f"j{i}") for i in range(10)])
    assert [r.state for r in records] == [JobState.ASSIGNED] * 2 + [JobState.QUEUED] * 8, \
        [(r.spec.name, r.state.value) for r in records]


def test_a_bad_bundle_digest_stores_none_and_names_the_spec(cp: ControlPlane) -> None:
    cp.register_worker(cuda_caps(4), cpu_slots=0)
    before = stored_ids(cp)
    digest = hashlib.sha256(b"never uploaded").hexdigest()
    specs = [gpu_job(), gpu_job(), CommandJob(command=["true"], bundle_digest=digest), gpu_job()]
    with pytest.raises(InvalidInput) as info:
        cp.submit_many(specs)
    assert stored_ids(cp) == before
    assert cp.poll_tasks(cp.list_workers()[0].id) == []  # no pass placed the good ones either
    message = str(info.value)
    assert digest in message and "no bundle with that address" in message
    assert message.startswith("specs[2]: "), message


def test_arguments_over_a_limit_store_none_and_name_the_spec(cp: ControlPlane,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    monkeypatch.setenv("GPULAYER_MAX_ARGS_MB", "0.001")
    ok = FunctionJob(function="m:f", args=[1], placement=WAIT)
    big = FunctionJob(function="m:f", args=["x" * 2000], placement=WAIT)
    with pytest.raises(InvalidArgument, match=r"^specs\[2\]: arguments of m:f: \d+ bytes of JSON, over the limit "
                                              r"of 0.001 MB \(GPULAYER_MAX_ARGS_MB\)"):
        cp.submit_many([ok, ok, big, ok])
    monkeypatch.setenv("GPULAYER_MAX_ARGS_MB", "1")
    monkeypatch.setenv("GPULAYER_MAX_ARGS_VALUES", "100")
    many = FunctionJob(function="m:g", args=[list(range(200))], placement=WAIT)
    with pytest.raises(InvalidArgument, match=r"^specs\[1\]: arguments of m:g: more than 100 values"):
        cp.submit_many([ok, many])
    assert stored_ids(cp) == set()
    # the good ones alone are taken
    assert len(cp.submit_many([ok, ok])) == 2


def test_specs_that_are_not_resolved_are_refused_naming_the_spec(cp: ControlPlane) -> None:
    with pytest.raises(InvalidInput, match=r"^specs\[1\]: spec.bundle: the control plane takes bundles by address"):
        cp.submit_many([gpu_job(placement=WAIT), CommandJob(command=["true"], bundle="/some/dir")])
    with pytest.raises(InvalidInput, match=r"^specs\[0\]: target cloud: .*embedded"):
        cp.submit_many([CommandJob(command=["true"], placement=Placement(target="cloud"))])
    assert stored_ids(cp) == set()


def test_an_empty_batch_and_one_over_the_limit_are_refused(cp: ControlPlane,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput, match=r"^specs: empty"):
        cp.submit_many([])
    monkeypatch.setattr(control_jobs, "MAX_BATCH", 3)
    with pytest.raises(InvalidInput, match=r"^specs: 4 job specs, over the limit of 3 in one batch"):
        cp.submit_many([gpu_job(placement=WAIT) for _ in range(4)])
    assert stored_ids(cp) == set()
    assert len(cp.submit_many([gpu_job(placement=WAIT) for _ in range(3)])) == 3  # the limit itself is taken


def test_the_same_batch_and_key_again_gets_the_same_jobs(cp: ControlPlane) -> None:
    cp.register_worker(cuda_caps(1), cpu_slots=0)
    specs = [gpu_job(placement=WAIT) for _ in range(3)]
    first = cp.submit_many(specs, idempotency_key="batch-1")
    again = cp.submit_many(specs, idempotency_key="batch-1")
    assert ids(again) == ids(first)
    assert stored_ids(cp) == set(ids(first))
    # another key is another batch
    other = cp.submit_many(specs, idempotency_key="batch-2")
    assert not set(ids(other)) & set(ids(first))
    assert len(stored_ids(cp)) == 6


@pytest.mark.parametrize("size", [2, 4])
def test_a_key_used_by_a_batch_of_another_size_is_a_conflict(cp: ControlPlane, size: int) -> None:
    specs = [gpu_job(placement=WAIT) for _ in range(3)]
    first = cp.submit_many(specs, idempotency_key="k")
    with pytest.raises(Conflict, match="idempotency_key 'k': a batch of another size"):
        cp.submit_many([gpu_job(placement=WAIT) for _ in range(size)], idempotency_key="k")
    assert stored_ids(cp) == set(ids(first))


def test_idempotency_keys_are_scoped_to_the_owner(cp: ControlPlane) -> None:
    specs = [gpu_job(placement=WAIT) for _ in range(2)]
    alice = cp.submit_many(specs, idempotency_key="k", owner="tok-alice")
    bob = cp.submit_many(specs, idempotency_key="k", owner="tok-bob")
    assert not set(ids(alice)) & set(ids(bob))
    assert ids(cp.submit_many(specs, idempotency_key="k", owner="tok-alice")) == ids(alice)
    assert ids(cp.submit_many(specs, idempotency_key="k", owner="tok-bob")) == ids(bob)
    assert {cp.job_owner(i) for i in ids(alice)} == {"tok-alice"}
    assert {cp.job_owner(i) for i in ids(bob)} == {"tok-bob"}
    assert len(stored_ids(cp)) == 4


def test_a_job_no_worker_could_run_is_unschedulable_in_a_batch_as_alone(cp: ControlPlane) -> None:
    cpu = cp.register_worker(make_capabilities(), cpu_slots=1)
    alone = cp.submit(gpu_job())
    records = cp.submit_many([CommandJob(command=["true"]), gpu_job(), gpu_job(placement=WAIT)])
    assert [r.state for r in records] == [JobState.ASSIGNED, JobState.UNSCHEDULABLE, JobState.QUEUED]
    assert alone.state is JobState.UNSCHEDULABLE
    assert records[1].decision is not None and alone.decision is not None
    assert records[1].decision.render() == alone.decision.render() == (
        f"scheduling: no eligible worker\n{cpu.id}: needs 1 usable cuda device(s), worker has 0")
    assert records[2].decision is not None and records[2].decision.outcome == "unschedulable"


# --------------------------------------------------------------------------- the client


@pytest.fixture
def embedded(gpulayer_isolated: None) -> client_mod.Client:
    """The SDK's client on a fresh embedded home (no real devices)."""
    return client_mod.connect()


REMOTE_WAIT = Placement(target="remote", on_unschedulable="wait")  # no worker: they stay queued


def test_the_client_splits_a_batch_into_calls_of_at_most_max_batch(
        embedded: client_mod.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, str | None]] = []
    real = embedded.api.submit_many

    def record(specs: list[Any], **kw: Any) -> Any:
        calls.append((len(specs), kw.get("idempotency_key")))
        return real(specs, **kw)

    monkeypatch.setattr(embedded.api, "submit_many", record)
    monkeypatch.setattr(client_mod, "MAX_BATCH", 2)
    specs = [CommandJob(command=["echo", str(i)], placement=REMOTE_WAIT) for i in range(5)]
    records = embedded.submit_many(specs, idempotency_key="mine")
    assert [r.spec.command for r in records] == [["echo", str(i)] for i in range(5)]  # type: ignore[union-attr]
    assert calls == [(2, "mine/0"), (2, "mine/1"), (1, "mine/2")]
    # the same call again gets the same jobs back, chunk by chunk
    assert ids(embedded.submit_many(specs, idempotency_key="mine")) == ids(records)
    assert len(embedded.api.list_jobs(limit=100)) == 5


def test_a_refused_spec_is_named_by_its_place_in_the_whole_list(
        embedded: client_mod.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split into calls of 2, the list's 4th spec is the 2nd of the second call: the error
    names it as the caller wrote it, specs[3]. (The first call's jobs were stored: each call
    is all or nothing, as documented.)"""
    monkeypatch.setattr(client_mod, "MAX_BATCH", 2)
    monkeypatch.setenv("GPULAYER_MAX_ARGS_MB", "0.001")
    specs = [FunctionJob(function="m:f", args=[i], placement=REMOTE_WAIT) for i in range(5)]
    specs[3] = FunctionJob(function="m:f", args=["x" * 2000], placement=REMOTE_WAIT)
    with pytest.raises(InvalidArgument) as info:
        embedded.submit_many(specs)
    assert str(info.value).startswith("specs[3]: arguments of m:f: "), str(info.value)
    assert len(embedded.api.list_jobs()) == 2


def test_requests_of_a_batch_are_split_by_their_size_and_calls_in_process_only_by_count(
        embedded: client_mod.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server bounds a request's body (gpulayer.server.app._body_limit): the runs sent to one
    are measured; the control plane in this process takes any size (its count is bounded)."""
    monkeypatch.setattr(client_mod, "BATCH_BYTES", 30_000)
    specs = [FunctionJob(function="m:f", args=["x" * 10_000], placement=REMOTE_WAIT) for _ in range(5)]
    measured = [len(run) for run in client_mod._batches(specs, measure=True)]
    assert measured == [2, 2, 1]  # ~10 kB per spec: two fit in 30 kB, three do not
    # a spec larger than the allowance still goes, alone
    big = [FunctionJob(function="m:f", args=["y" * 50_000], placement=REMOTE_WAIT)] * 2
    assert [len(run) for run in client_mod._batches(big, measure=True)] == [1, 1]
    sizes: list[int] = []
    real = embedded.api.submit_many
    monkeypatch.setattr(embedded.api, "submit_many", lambda specs, **kw: sizes.append(len(specs)) or real(specs, **kw))
    records = embedded.submit_many(specs)
    assert sizes == [5]
    assert [r.spec.args for r in records] == [["x" * 10_000]] * 5  # type: ignore[union-attr]


def test_the_client_builds_and_uploads_a_bundle_once_for_the_batch(
        embedded: client_mod.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text("print('one')\n")
    uploaded: list[str] = []
    put = embedded.api.put_bundle
    monkeypatch.setattr(embedded.api, "put_bundle", lambda d, data, **kw: uploaded.append(d) or put(d, data, **kw))
    specs = [CommandJob(command=["python", "job.py", str(i)], bundle=str(code), placement=REMOTE_WAIT)
             for i in range(4)]
    records = embedded.submit_many(specs)
    assert len(uploaded) == 1
    assert {r.spec.bundle_digest for r in records} == {uploaded[0]}
    assert {r.spec.bundle for r in records} == {None}


# --------------------------------------------------------------------------- gl.submit_many and .map (bad input)


def double(x: int) -> int:
    return 2 * x


def add(x: int, y: int) -> int:
    return x + y


def test_submit_many_refuses_what_is_not_a_list_of_specs(gpulayer_isolated: None) -> None:
    spec = CommandJob(command=["true"], placement=REMOTE_WAIT)
    with pytest.raises(InvalidArgument, match=r"specs is one job spec; pass a list of them"):
        gl.submit_many(spec)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"specs\[1\] is str; accepted: CommandJob, FunctionJob, DistributedJob"):
        gl.submit_many([spec, "true"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match=r"specs\[0\] is dict"):
        gl.submit_many([{"kind": "command", "command": ["true"]}])  # type: ignore[list-item]
    assert gl.submit_many([]) == []
    assert client_mod.connect().api.list_jobs() == []


@pytest.mark.parametrize(("call", "message"), [
    (lambda f: f.map(), r"\.map\(\): give at least one iterable of arguments"),
    (lambda f: f.map("abc"), r"\.map\(\): argument 1 is str; accepted: a list, tuple, range"),
    (lambda f: f.map([1], b"ab"), r"\.map\(\): argument 2 is bytes"),
    (lambda f: f.map({"a": 1}), r"\.map\(\): argument 1 is dict"),
    (lambda f: f.map(5), r"\.map\(\): argument 1 is int"),
    (lambda f: f.map([1, 2, 3], [1, 2]), r"\.map\(\): the iterables differ in length"),
    (lambda f: f.map(range(2), iter(range(3))), r"\.map\(\): the iterables differ in length"),
], ids=["none", "str", "bytes", "dict", "int", "lists-differ", "iterator-longer"])
def test_map_refuses_bad_iterables_naming_them(gpulayer_isolated: None, call: Callable[[Any], Any],
                                               message: str) -> None:
    f = gl.remote(add)
    with pytest.raises(InvalidArgument, match=message) as info:
        call(f)
    assert f.function in str(info.value)  # "tests.unit.test_submit_many:add.map(): ..."
    assert client_mod.connect().api.list_jobs() == []


def test_map_names_the_call_whose_argument_is_not_json(gpulayer_isolated: None) -> None:
    """It said "args[0]: a set is not JSON", true of no call in particular: which item of a long
    list was it?"""
    f, g = gl.remote(double), gl.remote(add)
    with pytest.raises(InvalidArgument) as info:
        f.map([1, 2, {3}])
    assert str(info.value) == (
        f"{f.function}.map(): call 2 (item 2 of its iterable): args[0]: a set is not JSON; "
        "accepted: None, bool, int, finite float, str, list, dict with str keys")
    with pytest.raises(InvalidArgument) as info:
        g.map([1, 2], [3, float("nan")])
    assert str(info.value).startswith(f"{g.function}.map(): call 1 (item 1 of each iterable): args[1]: nan is not JSON")
    assert client_mod.connect().api.list_jobs() == []


def test_calls_the_function_could_not_take_are_refused_before_anything_is_submitted(
        gpulayer_isolated: None) -> None:
    """A keyword the function does not have, an argument too many or one missing was
    submitted, waited in the queue, started, and failed on the worker with Python's TypeError,
    where a call here (and Ray's .remote()) refuses it at once."""
    f, g = gl.remote(double), gl.remote(add)
    with pytest.raises(InvalidArgument) as info:
        f.remote(1, y=3)
    assert str(info.value) == "double.remote(): got an unexpected keyword argument 'y'; it takes double(x)"
    with pytest.raises(InvalidArgument, match=r"^double\.remote\(\): too many positional arguments"):
        f.remote(1, 2)
    with pytest.raises(InvalidArgument, match=r"^add\.spec\(\): missing a required argument: 'y'"):
        g.spec(1)
    with pytest.raises(InvalidArgument) as info:
        g.map([1, 2], [3, 4], [5, 6])
    assert str(info.value) == (f"{g.function}.map(): call 0 (item 0 of each iterable): too many positional "
                               "arguments; it takes add(x, y)")
    assert client_mod.connect().api.list_jobs() == []
    # what it takes, by position or by keyword, is taken; and gl.explain needs no call
    assert f.spec(x=2).kwargs == {"x": 2} and g.spec(1, y=2).args == [1]  # type: ignore[union-attr]
    assert gl.explain(g).decision.outcome in ("assigned", "waiting", "unschedulable")


def test_map_of_empty_iterables_submits_nothing(gpulayer_isolated: None) -> None:
    assert gl.remote(double).map([]) == []
    assert gl.remote(add).map([], ()) == []


def test_submit_many_raises_unschedulable_and_keeps_the_others(gpulayer_isolated: None, probes_seeded: None) -> None:
    """As gl.submit: a job no worker could ever run raises Unschedulable naming it; the
    other jobs of the batch were stored."""
    waiting = CommandJob(command=["true"], placement=REMOTE_WAIT)
    never = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                       placement=Placement(target="local"))
    with pytest.raises(Unschedulable, match="needs 1 usable cuda device") as info:
        gl.submit_many([waiting, never])
    jobs = client_mod.connect().api.list_jobs()
    assert len(jobs) == 2
    by_id = {j.id: j for j in jobs}
    assert info.value.job_id is not None and by_id[info.value.job_id].state is JobState.UNSCHEDULABLE
    [other] = [j for j in jobs if j.id != info.value.job_id]
    assert other.state is JobState.QUEUED


def test_except_job_failed_catches_a_job_no_worker_could_run(gpulayer_isolated: None, probes_seeded: None) -> None:
    """handle.result() promised JobFailed for every unsuccessful end, and Trainer.fit()'s
    callers catch JobFailed; an unschedulable job's Unschedulable was no JobFailed, and
    went through them."""
    never = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                       placement=Placement(target="local"))
    with pytest.raises(gl.JobFailed) as info:
        gl.submit(never)
    assert type(info.value) is Unschedulable and info.value.state == "unschedulable"
    assert info.value.exit_code is None and info.value.job_id is not None
    with pytest.raises(gl.JobFailed, match="needs 1 usable cuda device") as again:
        gl.get_job(info.value.job_id).result()
    assert type(again.value) is Unschedulable and again.value.state == "unschedulable"


# --------------------------------------------------------------------------- .map end to end (a real worker)

MODULE = """
import gpulayer as gl


@gl.remote
def square(x):
    return x * x


@gl.remote
def join(a, b):
    return f"{a}-{b}"
"""


@pytest.fixture
def mapmod(gpulayer_isolated: None, probes_seeded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A module of @gl.remote functions in a directory of its own (its bundle), imported."""
    with job_module(tmp_path, monkeypatch, "mapmod", MODULE) as module:
        yield module


def test_map_runs_one_job_per_call_and_returns_the_results_in_order(mapmod: Any) -> None:
    handles = mapmod.square.map(range(5))
    assert [h.result(timeout=120) for h in handles] == [0, 1, 4, 9, 16]
    pairs = mapmod.join.map(["a", "b", "c"], (1, 2, 3))
    assert [h.result(timeout=120) for h in pairs] == ["a-1", "b-2", "c-3"]
    jobs = client_mod.connect().api.list_jobs()
    assert len(jobs) == 8 and {j.state for j in jobs} == {JobState.SUCCEEDED}
    # the batch shared one bundle
    assert len({j.spec.bundle_digest for j in jobs}) == 1
    assert {j.spec.function for j in jobs} == {mapmod.square.function, mapmod.join.function}  # type: ignore[union-attr]
