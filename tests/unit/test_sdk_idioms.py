"""What a user coming from Ray writes without reading much, and what it does here: a handle
given as another call's argument, ``gl.wait(handles, num_returns=...)``, ``gl.connect(url=...)``
before ``.remote()``. Each test is a defect found by trying those idioms."""

from __future__ import annotations

import pickle

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.errors import ConnectionFailed, InvalidArgument
from tests.server_support import free_port


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
