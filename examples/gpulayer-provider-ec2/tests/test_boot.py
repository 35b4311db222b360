"""Play the booted machine: run the user-data EC2 holds, so its worker joins a real server."""

from __future__ import annotations

from pathlib import Path

from conftest import launch_request, play_machine, stop, wait_for


def test_the_user_data_joins_a_worker_with_the_bootstrap_token(make_provider, ec2, label, server, tmp_path):
    p = make_provider()
    token = server.bootstrap_token()
    launched = p.launch(launch_request(p, label, "m-boot1", url=server.url, token=token))
    instance_id = launched.provider_id.split("/")[1]

    machine = play_machine(ec2(), instance_id, tmp_path / "machine")
    try:
        worker = wait_for(lambda: next((w for w in server.workers() if w["name"] == "m-boot1" and w["online"]), None),
                          60, "the machine's worker to join")
        assert worker["origin"] == "provider"
        # the token travelled in the environment: the worker's command line does not hold it
        cmdline = Path(f"/proc/{machine.pid}/cmdline").read_bytes().split(b"\0")
        assert b"worker" in cmdline and not any(token.encode() in part for part in cmdline)
    finally:
        stop(machine)

    # the join spent it: a second boot from the same user-data is refused
    again = play_machine(ec2(), instance_id, tmp_path / "replay")
    assert again.wait(60) != 0
    log = (tmp_path / "replay" / "machine.log").read_text()
    assert "is used up" in log, log
    assert [w["name"] for w in server.workers()].count("m-boot1") == 1
