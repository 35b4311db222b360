"""Bundled GPUlayer plugin: the ``ssh`` provider, a pool of hosts you own.

When ``cloud`` jobs wait and a host of the pool is free, GPUlayer connects to it over SSH
(paramiko; key authentication only, the host key checked against a known_hosts file) and
starts ``PYTHON -m gpulayer.cli worker start --name MACHINE_ID`` there, detached in a session
of its own; the worker joins the control plane with the single-use bootstrap token of its
machine and is stopped (SIGTERM to its process group, then SIGKILL) when the core
terminates the machine, after its idle timeout.

* ``offers``: one per host, no price (capacity you own), ``available`` unless a worker of
  this pool already runs there (one machine per host). A host's capabilities are what it
  declares in providers.toml (``cpus`` and ``memory_gb``, optionally ``devices`` and
  ``frameworks``) or, when it declares nothing, what ``PYTHON -m gpulayer.cli resources
  detect --json`` says on it, probed once per server run.
* ``launch``: the token, the control-plane URL and the machine id travel in a JSON request
  on the SSH channel's stdin to :mod:`gpulayer_ssh.remote`, which puts them in the worker's
  environment; nothing secret is in any argv, on the host or here. The machine id and the
  label are written to a marker file on the host.
* ``list``: the markers carrying the label whose worker process is alive.
* ``terminate``: stop the worker's process tree and remove its marker; no marker is success.
* ``check``: connect to every host; a refused key or an unknown or changed host key is
  ``ProviderAuthFailed`` naming the host; an unreachable host is ``ProviderTransient``.

Every connection and remote step has a timeout (``connect_timeout``, ``command_timeout``).
paramiko (the ``ssh`` extra: ``pip install 'gpulayer[ssh]'``) is imported only when a pool
is configured, so loading the plugin costs nothing where no one uses it.
This module imports only :mod:`gpulayer.plugin` from GPUlayer, as a third-party provider would.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpulayer import plugin
from gpulayer_ssh.config import DeclaredDevices, HostConfig, SshPoolConfig

__all__ = ["DeclaredDevices", "HostConfig", "SshPoolConfig"]


def _create(name: str, config: SshPoolConfig) -> plugin.Provider:
    try:
        from gpulayer_ssh.provider import SshProvider
    except ImportError as exc:
        raise plugin.ProviderError(f"provider {name!r} (type \"ssh\") needs paramiko, which is not installed "
                                   f"({exc}): pip install 'gpulayer[ssh]'") from exc
    return SshProvider(name, config)


@plugin.hookimpl
def gpulayer_provider_adapters() -> Iterator[plugin.ProviderAdapter]:
    yield plugin.ProviderAdapter(
        name="ssh",
        description="a pool of hosts you own: a worker is started over SSH when cloud jobs wait, stopped when idle",
        config=SshPoolConfig, create=_create)
