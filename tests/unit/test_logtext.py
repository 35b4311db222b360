"""How a job's output is shown: :class:`gpulayer.logtext.NodeLines`, the ``[node R]`` line
prefixes of a job of several nodes, over chunks that end inside lines."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer import logtext
from gpulayer.logtext import NodeLines


def shown(lines: NodeLines, chunks: list[tuple[int, str, str]]) -> str:
    text = "".join(lines.text(data, node, stream) for node, stream, data in chunks)
    return text + "".join(rest for _, rest in lines.rest())


def test_a_line_cut_between_chunks_is_shown_whole_after_one_prefix() -> None:
    # node 0's line "step 1 loss 0.5" came in two chunks with node 1's output between them:
    # shown chunk by chunk, node 1's line landed inside it and the prefix came twice
    chunks = [(0, "stdout", "ready\nstep 1 "), (1, "stdout", "ready\n"), (0, "stdout", "loss 0.5\n")]
    assert shown(NodeLines(True), chunks) == "[node 0] ready\n[node 1] ready\n[node 0] step 1 loss 0.5\n"


def test_streams_and_nodes_are_held_apart_and_what_never_ended_comes_last() -> None:
    lines = NodeLines(True)
    assert lines.text("a", 0, "stdout") == ""
    assert lines.text("warn", 0, "stderr") == ""
    assert lines.text("b\nc", 0, "stdout") == "[node 0] ab\n"
    assert lines.text("ing\n", 0, "stderr") == "[node 0] warning\n"
    assert lines.rest() == [("stdout", "[node 0] c\n")]
    assert lines.rest() == []


def test_a_carriage_return_ends_a_line_so_progress_bars_show_as_they_go() -> None:
    assert NodeLines(True).text("10%\r", 1, "stderr") == "[node 1] 10%\r"


def test_a_line_longer_than_the_hold_is_shown_in_lines_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logtext, "HOLD_LINE", 8)
    lines = NodeLines(True)
    assert lines.text("0123", 0, "stdout") == ""
    assert lines.text("456789", 0, "stdout") == "[node 0] 0123456789\n"
    assert lines.text("ab\n", 0, "stdout") == "[node 0] ab\n"


def test_without_prefixes_the_text_passes_as_it_is() -> None:
    lines = NodeLines(False)
    assert lines.text("a", 0, "stdout") + lines.text("b\nc", 0, "stdout") == "ab\nc"
    assert lines.rest() == []


def test_a_ctrl_c_while_following_shows_the_line_each_node_had_not_ended(tmp_path: Path) -> None:
    """``gpulayer jobs logs --follow`` (and ``submit``, which follows the same way) held each
    node's unfinished line for its end, and a Ctrl-C dropped it: what a hung node printed
    last, the reason to stop following, was never shown."""
    import gpulayer as gl
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store
    from tests.factories import make_capabilities
    from tests.server_support import base_env, stop_proc

    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    cp = ControlPlane(store)
    workers = [cp.register_worker(make_capabilities(), cpu_slots=1, origin="existing").id for _ in range(2)]
    job = cp.submit(gl.DistributedJob(entry="train.py", nodes=2, placement=gl.Placement(target="remote")))
    for w in workers:
        for a in cp.poll_tasks(w):
            cp.start_task(a.task_id, worker_id=w)
            text = "ready\nloading checkpoint " if a.node_rank == 0 else "ready\n"
            cp.append_logs(a.task_id, worker_id=w, chunks=[("stdout", text)])
    store.dispose()
    # (the embedded control plane of tmp_path: no GPULAYER_URL another test of this process set)
    env = base_env(tmp_path, PYTHONUNBUFFERED="1", GPULAYER_WARM_CLI="0")
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "jobs", "logs", "--follow", job.id], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "[node 1] ready\n" not in seen:  # (both nodes' whole lines shown: following)
            line = proc.stdout.readline() if proc.stdout else ""
            assert line, proc.communicate(timeout=30)
            seen += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        stop_proc(proc, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert seen + out == "[node 0] ready\n[node 1] ready\n[node 0] loading checkpoint \n", (seen + out, err)
