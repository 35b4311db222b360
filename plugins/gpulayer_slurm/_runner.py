"""Where Slurm's commands run: on this machine, or on a login node reached through SSH.

Both runners take an argv, an environment to add (secrets included: it never becomes part
of an argv) and an optional stdin, and answer ``(returncode, stdout, stderr)``.

Locally the environment is the subprocess's own. Over SSH a server's ``AcceptEnv`` cannot
be relied on, so the command runs under a few lines of Python on the login node that read
``{"env": ..., "stdin": ...}`` as JSON from the channel's stdin and run the argv with
them: the remote argv holds names and options only.

A command that cannot be found, a munge or SSH authentication failure is
``ProviderAuthFailed`` (the provider is unusable until someone fixes it); a timeout or a
lost connection is ``ProviderTransient``.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from typing import Protocol

from gpulayer import plugin

Result = tuple[int, str, str]

# Runs on the login node: argv from the command line, environment and stdin from stdin.
_REMOTE_EXEC = (
    "import json,os,subprocess,sys\n"
    "d=json.load(sys.stdin)\n"
    "e=dict(os.environ);e.update(d['env'])\n"
    "try:\n"
    "    p=subprocess.run(sys.argv[1:],env=e,input=d['stdin'].encode())\n"
    "except FileNotFoundError as x:\n"
    "    sys.stderr.write(f'{x.filename}: command not found\\n');sys.exit(127)\n"
    "sys.exit(p.returncode)\n"
)


class Runner(Protocol):
    """Runs one Slurm command; see the module docstring."""

    where: str

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float) -> Result: ...


class LocalRunner:
    """Slurm's commands on this machine, with ``SLURM_CONF`` set when the config names one."""

    def __init__(self, slurm_conf: str | None = None) -> None:
        self.slurm_conf = slurm_conf
        self.where = "this machine"

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float) -> Result:
        full = dict(os.environ)
        if self.slurm_conf:
            full["SLURM_CONF"] = self.slurm_conf
        full.update(env or {})
        try:
            return plugin.run_tool(argv, timeout, input=stdin, env=full, check=False)
        except plugin.ToolNotFound:
            raise plugin.ProviderAuthFailed(
                f"{argv[0]}: not found on PATH on {self.where}; install Slurm's client commands "
                "(Debian: slurm-client) or set ssh_host to run them on a login node") from None
        except plugin.ToolTimeout:
            raise plugin.ProviderTransient(f"{argv[0]} did not answer within {timeout:g}s on {self.where}") from None
        except plugin.ToolFailed as exc:  # could not even be started
            raise plugin.ProviderAuthFailed(f"{argv[0]} could not be run on {self.where}: {exc}") from None


class SshRunner:
    """Slurm's commands on a login node, through one paramiko connection kept open."""

    def __init__(self, host: str, *, port: int = 22, user: str | None = None, key_file: str | None = None,
                 known_hosts: str | None = None, python: str = "python3", slurm_conf: str | None = None,
                 connect_timeout: float = 15.0) -> None:
        self.host, self.port, self.user, self.key_file = host, port, user, key_file
        self.known_hosts, self.python, self.slurm_conf = known_hosts, python, slurm_conf
        self.connect_timeout = connect_timeout
        self.where = f"{user + '@' if user else ''}{host}:{port}"
        self._client: object | None = None
        self._lock = threading.Lock()

    def _connect(self) -> object:
        import paramiko

        client = paramiko.SSHClient()
        if self.known_hosts:
            client.load_host_keys(os.path.expanduser(self.known_hosts))
        else:
            client.load_system_host_keys()
        # An unknown host key is refused: a login node is a machine you know.
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(self.host, port=self.port, username=self.user,
                           key_filename=os.path.expanduser(self.key_file) if self.key_file else None,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, allow_agent=self.key_file is None,
                           look_for_keys=self.key_file is None)
        except paramiko.AuthenticationException as exc:
            raise plugin.ProviderAuthFailed(f"ssh to {self.where}: authentication failed: {exc}") from None
        except paramiko.SSHException as exc:  # host key refused, protocol trouble
            raise plugin.ProviderAuthFailed(f"ssh to {self.where}: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise plugin.ProviderTransient(f"ssh to {self.where}: cannot connect: {exc}") from None
        return client

    def command_line(self, argv: list[str], *, env: dict[str, str] | None, stdin: str | None) -> tuple[str, str | None]:
        """The remote command line and what goes to its stdin (the secrets travel there)."""
        if self.slurm_conf:
            argv = ["env", f"SLURM_CONF={self.slurm_conf}", *argv]
        if not env and stdin is None:
            return shlex.join(argv), None
        payload = json.dumps({"env": env or {}, "stdin": stdin or ""})
        return shlex.join([self.python, "-c", _REMOTE_EXEC, *argv]), payload

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float) -> Result:
        import paramiko

        line, payload = self.command_line(argv, env=env, stdin=stdin)
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            client = self._client
        assert isinstance(client, paramiko.SSHClient)
        try:
            chan_in, chan_out, chan_err = client.exec_command(line, timeout=timeout)
            if payload is not None:
                chan_in.write(payload)
            chan_in.channel.shutdown_write()
            out = chan_out.read().decode(errors="replace")
            err = chan_err.read().decode(errors="replace")
            rc = chan_out.channel.recv_exit_status()
        except TimeoutError:
            self.close()
            raise plugin.ProviderTransient(f"{argv[0]} did not answer within {timeout:g}s on {self.where}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise plugin.ProviderTransient(f"ssh to {self.where}: {exc}") from None
        if rc == 127:
            raise plugin.ProviderAuthFailed(f"{argv[0]}: not found on {self.where}: {err.strip()}")
        return rc, out, err

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()  # type: ignore[attr-defined]
