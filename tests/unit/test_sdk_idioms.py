"""What a user coming from Ray writes without reading much, and what it does here: a handle
given as another call's argument, ``gl.wait(handles, num_returns=...)``, ``gl.connect(url=...)``
before ``.remote()``. Each test is a defect found by trying those idioms."""

from __future__ import annotations

import pickle
import threading

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.errors import ConnectionFailed, InvalidArgument
from gpulayer.specs import CommandJob, Placement
from tests.server_support import free_port

#: no worker serves the remote target in an embedded home: such a job stays queued
REMOTE_WAIT = Placement(target="remote", on_unschedulable="wait")


def add(a, b):  # type: ignore[no-untyped-def]
    return a + b


def test_a_handle_given_as_an_argument_says_what_to_do_instead(gpulayer_isolated: None) -> None:
    """Ray resolves an ObjectRef given as an argument to its value; here it said only
    "args[0]: a JobHandle is not JSON", naming neither the call nor what to write instead."""
    f = gl.remote(add)
    h = gl.get_job("job-0123456789ab")  # (a handle; nothing reads its job)
    with pytest.raises(InvalidArgument) as info:
        f.remote(h, 1)
    message = str(info.value)
    assert message.startswith("add.remote(): args[0]: a JobHandle (job-0123456789ab) is not JSON")
    assert "h.result()" in message and "after=" in message and "gl.get_job(" in message
    with pytest.raises(InvalidArgument, match=r"add\.remote\(\): kwargs\[\"b\"\]\[0\]: a JobHandle"):
        f.remote(1, b=[h])
    with pytest.raises(InvalidArgument, match=r"\.map\(\): call 1 \(item 1 of each iterable\): args\[1\]: a JobHandle"):
        f.map([1, 2], [3, h])
    assert client_mod.connect().api.list_jobs() == []


def test_connect_naming_a_server_makes_it_where_remote_calls_go(gpulayer_isolated: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``gl.connect(url=..., token=...)`` then ``f.remote()`` is a Ray user's ``ray.init(address=...)``
    then ``f.remote()``: the job went to the embedded control plane instead, and ran on this
    machine, with no word that the server was never asked."""
    monkeypatch.setenv("GPULAYER_HTTP_RETRY_SECONDS", "0")
    url = f"http://127.0.0.1:{free_port()}"  # (nothing listens: a call that reaches it fails at once)
    chosen = gl.connect(url=url, token="glt_not-a-real-token")
    assert gl.connect() is chosen
    h = gl.get_job("job-0123456789ab")
    assert h._client is chosen and pickle.loads(pickle.dumps(h))._client is chosen
    f = gl.remote(add)
    with pytest.raises(ConnectionFailed, match=f"cannot reach the control plane at {url}"):
        f.remote(1, 2)
    with pytest.raises(ConnectionFailed, match=f"cannot reach the control plane at {url}"):
        gl.submit(gl.CommandJob(command=["true"]))
    client_mod.reset()  # (forgets the choice: back to $GPULAYER_URL, here none: embedded)
    assert gl.connect().embedded and gl.connect().api.list_jobs() == []


def test_wait_with_num_returns_answers_ended_and_not_ended_handles_as_ray_wait_does(
        gpulayer_isolated: None) -> None:
    """``ready, not_ready = gl.wait(handles, num_returns=1, timeout=5)`` (``ray.wait``) was a
    TypeError; ``gl.wait`` without it waits for all of them and answers their records."""
    a, b, c = gl.submit_many([CommandJob(command=["true"], placement=REMOTE_WAIT) for _ in range(3)])
    try:
        b.cancel()
        assert gl.wait([a, b, c], num_returns=1) == ([b], [a, c])
        # time runs out: what ended by then, and no error (as ray.wait)
        assert gl.wait([a, b, c], num_returns=2, timeout=0.2) == ([b], [a, c])
        assert gl.wait([a, b, c], num_returns=2, timeout=0) == ([b], [a, c])
        threading.Timer(0.3, a.cancel).start()
        assert gl.wait([c, b, a], num_returns=2, timeout=60) == ([b, a], [c])  # (in the order given)
        assert gl.wait([a, b, c], num_returns=1) == ([a], [b, c])  # (at most num_returns ended)
        assert gl.wait([], num_returns=1) == ([], [])
        for bad in (0, 4, True, 1.5, "2"):
            with pytest.raises(InvalidArgument, match=rf"^gl.wait\(num_returns={bad!r}\): accepted: a whole number "
                                                      r"from 1 to 3, the number of jobs given"):
                gl.wait([a, b, c], num_returns=bad)  # type: ignore[call-overload]
    finally:
        gl.cancel([a, b, c])


@pytest.mark.parametrize(("name", "hint"), [
    ("get", "[h.result() for h in handles]"),
    ("init", "gl.connect(url=..., token=...)"),
    ("put", "JSON"),
    ("kill", "gl.cancel(handles)"),
])
def test_a_ray_name_gpulayer_lacks_says_what_to_use(name: str, hint: str) -> None:
    """``gl.get(handles)`` said only "module 'gpulayer' has no attribute 'get'"."""
    with pytest.raises(AttributeError) as info:
        getattr(gl, name)
    message = str(info.value)
    assert message.startswith(f"module 'gpulayer' has no attribute {name!r}; ") and hint in message
    with pytest.raises(AttributeError, match=r"^module 'gpulayer' has no attribute 'nothing'$"):
        gl.nothing  # type: ignore[attr-defined]  # noqa: B018
