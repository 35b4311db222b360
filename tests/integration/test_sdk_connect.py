"""``gl.connect(url=..., token=...)`` against a real server process: what a wrong or missing
token given in the program is told."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer.errors import AuthError
from gpulayer.specs import CommandJob, Placement
from tests.server_support import ServerProc

REMOTE_WAIT = Placement(target="remote", on_unschedulable="wait")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "server").start()
    yield srv
    srv.stop()


def test_a_token_refused_names_gl_connect_where_the_program_gave_it(gpulayer_isolated: None,
                                                                    server: ServerProc) -> None:
    """A token given to gl.connect(token=...) that the server did not know was told
    "check GPULAYER_TOKEN / --token", and none given "give --token TOKEN or set
    GPULAYER_TOKEN": neither what the program set. (The client's home is not the server's:
    no admin token is read from it.)"""
    job = CommandJob(command=["true"], placement=REMOTE_WAIT)
    gl.connect(url=server.url, token="glt_nope")
    with pytest.raises(AuthError) as info:
        gl.submit(job)
    assert str(info.value) == "invalid token: no such token (check the token given to gl.connect(token=...))"
    gl.connect(url=server.url + "/")  # (another client: the same server, no token)
    with pytest.raises(AuthError) as info:
        gl.submit(job)
    assert str(info.value) == (f"missing token: {server.url} needs one; give it as gl.connect(token=...) or set "
                               "GPULAYER_TOKEN (what gpulayer token create printed)")
