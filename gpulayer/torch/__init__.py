"""The PyTorch integration: :func:`launch` and :class:`Trainer`.

Both submit a training entry (``train.py`` or ``package.module:function``) from a source
bundle and add what PyTorch needs to the job's requirements: the ``torch`` framework, plus
the torch sub-probe of the accelerator asked for (``torch.cuda``, ``torch.rocm``,
``torch.mps``, or a plugin's own such as ``torch.npu``: whichever ``torch.*`` sub-probe a
framework probe declares for that accelerator), so a worker whose torch cannot use the GPU
is turned down with a reason instead of failing at run time.

* One process (``nodes=1``, ``nproc_per_node=1``): a :class:`~gpulayer.specs.CommandJob`
  that runs the entry with the worker's job Python, with ``RANK=0``, ``LOCAL_RANK=0``,
  ``WORLD_SIZE=1``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT`` set, so a script
  written for torchrun (``dist.init_process_group("gloo")``) runs unchanged.
* More: a :class:`~gpulayer.specs.DistributedJob` for the launcher plugin (torchrun by
  default): ``nodes`` workers placed all at once, ``nproc_per_node`` processes on each.

``gpus_per_node`` sets the devices each node needs and, unless ``nproc_per_node`` is
given, one process per device. ``on_unschedulable`` defaults to ``"fail"``: a job no
registered worker could ever run raises :class:`~gpulayer.errors.Unschedulable` with the
scheduler's per-worker reasons at submit time.

This module never imports torch: the job's Python does, on the worker.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from gpulayer import joboptions, plugins
from gpulayer.errors import InvalidArgument, PluginError
from gpulayer.joboptions import JobOptions, SharedOptions
from gpulayer.records import JobRecord
from gpulayer.specs import (
    CommandJob,
    DistributedJob,
    parse_framework_spec,
    text_problem,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Trainer", "TrainerOptions", "launch", "torch_requirements", "torch_subprobe"]

#: Runs one process of a one-process job (``python -c SHIM ENTRY ARGS...``): sets the rank
#: environment torchrun would give a world of one, then runs the script, module or function.
#: Inline and stdlib-only so that the job's Python needs nothing from GPUlayer.
SINGLE_PROCESS_SHIM = """\
import importlib, os, runpy, socket, sys
entry, args = sys.argv[1], sys.argv[2:]
env = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": "1",
       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
os.environ.update(env)
if not os.environ.get("MASTER_PORT"):
    s = socket.socket(); s.bind(("127.0.0.1", 0))
    os.environ["MASTER_PORT"] = str(s.getsockname()[1]); s.close()
sys.argv = [entry, *args]
if ":" in entry and not entry.endswith(".py"):
    mod, _, attr = entry.partition(":")
    os.environ["GPULAYER_IMPORTING_JOB_MODULE"] = entry  # a gl.submit() at its top level refuses
    try:
        obj = importlib.import_module(mod)
    finally:
        os.environ.pop("GPULAYER_IMPORTING_JOB_MODULE", None)
    for part in attr.split("."):
        obj = getattr(obj, part)
    obj(*args)
elif entry.endswith(".py") or "/" in entry:
    sys.path.insert(0, os.path.dirname(os.path.abspath(entry)))
    runpy.run_path(entry, run_name="__main__")
else:
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
"""


def torch_requirements(
    frameworks: Mapping[str, str] | Iterable[str] | None, accelerator: str | None,
) -> dict[str, str]:
    """``frameworks`` (a mapping or 'name>=x' strings) plus ``torch`` and the sub-probe
    for ``accelerator``; what the caller gave for a name wins."""
    given: dict[str, str] = {}
    if frameworks is not None:
        if isinstance(frameworks, Mapping):
            given = {str(k): str(v or "") for k, v in frameworks.items()}
        elif isinstance(frameworks, str):
            name, spec = parse_framework_spec(frameworks)
            given = {name: spec}
        else:
            for item in frameworks:
                name, spec = parse_framework_spec(str(item))
                given[name] = spec
    out = {"torch": ""}
    kind = (accelerator or "").strip().lower()
    sub = torch_subprobe(kind) if kind else None
    if sub is not None:
        out[sub] = ""
    out.update(given)
    return out


def torch_subprobe(accelerator: str) -> str | None:
    """The sub-probe a torch job on ``accelerator`` needs: the ``torch.*`` sub-probe that a
    registered framework probe declares for that accelerator (None when none does).

    Read from the plugins (loading them imports no framework), so a plugin for a new
    accelerator teaches ``launch(accelerator=...)`` what to require.
    """
    found = [
        (sub.name, plugins.get_manager().owner("gpulayer_framework_probes", probe.name))
        for probe in plugins.framework_probes().values()
        for sub in probe.subprobes
        if sub.accelerator == accelerator and sub.name.split(".", 1)[0] == "torch"
    ]
    if len(found) > 1:
        offered = " and ".join(f"{name!r} (plugin {owner!r})" for name, owner in found)
        raise PluginError(
            f"two torch sub-probes are declared for accelerator {accelerator!r}: {offered}; "
            "a torch job on it could need either"
        )
    return found[0][0] if found else None


def _check_entry(entry: str, bundle: str | None) -> None:
    if not isinstance(entry, str) or not entry.strip():
        raise InvalidArgument("entry: expected a script ('train.py') or a function ('pkg.train:main')")
    is_function = ":" in entry and not entry.endswith(".py")
    if bundle is not None and not Path(bundle).is_dir():
        raise InvalidArgument(f"bundle={bundle!r}: no such directory; accepted: the folder of the job's code")
    if bundle is not None and not is_function and entry.endswith(".py") and not Path(entry).is_absolute():
        if not (Path(bundle) / entry).is_file():
            raise InvalidArgument(
                f"entry {entry!r}: no such file in the bundle directory {str(Path(bundle).resolve())!r}; "
                "the entry is a path relative to bundle="
            )


class TrainerOptions(SharedOptions, total=False):
    """The options of :class:`Trainer` and :func:`launch`: every job option
    (:class:`~gpulayer.joboptions.SharedOptions`, the same as ``@gl.remote``'s and
    ``gpulayer submit``'s), the devices as ``gpus_per_node``, and the shape of the run."""

    nodes: int
    nproc_per_node: int | None
    gpus_per_node: int | None
    args: Sequence[Any]
    launcher: str | None
    client: Any


_TRAINER_OPTIONS = frozenset(TrainerOptions.__optional_keys__)


class Trainer:
    """A PyTorch training job, described once and run with :meth:`fit` (or :meth:`submit`).

    ``Trainer("train.py", nodes=2, nproc_per_node=2, args=["--epochs", "3"]).fit()``
    submits it, streams its output here while it runs and returns the final
    :class:`~gpulayer.records.JobRecord`; a job that does not succeed raises
    :class:`~gpulayer.errors.JobFailed` (or :class:`~gpulayer.errors.Unschedulable`).
    The options are :class:`TrainerOptions`; ``bundle`` defaults to the current directory.
    """

    def __init__(self, entry: str, **options: Unpack[TrainerOptions]) -> None:
        self._describe(entry, options, "Trainer")

    @classmethod
    def _for(cls, entry: str, options: TrainerOptions, call: str) -> Trainer:
        """A Trainer whose errors name ``call`` (``launch``) as the thing the user called."""
        trainer = cls.__new__(cls)
        trainer._describe(entry, options, call)
        return trainer

    def _describe(self, entry: str, options: TrainerOptions, call: str) -> None:
        joboptions.check_option_names(options, _TRAINER_OPTIONS, call, renamed={"gpus": "gpus_per_node"})
        spelling = joboptions.keyword_spelling(call, gpus="gpus_per_node")
        opts: dict[str, Any] = dict(options)
        self._client = opts.pop("client", None)
        if self._client is not None:
            from gpulayer.sdk import client_for

            client_for(self._client, call)  # (a client given is checked here; the default one is made at submit)
        self.handle: Any = None
        nodes = opts.pop("nodes", 1)
        nproc_per_node = opts.pop("nproc_per_node", None)
        gpus = opts.pop("gpus_per_node", None)
        launcher = opts.pop("launcher", None)
        args = opts.pop("args", None)
        args = () if args is None else args
        if not isinstance(args, (list, tuple)):
            raise InvalidArgument(f"{call}(args={args!r}): {'a string, not a list' if isinstance(args, str) else 'not a list'}; "
                                  "accepted: a list of arguments such as ['--epochs', '3']")
        for i, a in enumerate(args):
            if isinstance(a, bool) or not isinstance(a, (str, int, float)):
                raise InvalidArgument(f"{call}(args[{i}]={a!r}): accepted: text or a number, as on a command line")
        self.args = [str(a) for a in args]
        opts.setdefault("bundle", ".")
        accelerator = opts.get("accelerator")
        frameworks = joboptions.frameworks(opts.get("frameworks"), spelling)
        opts["frameworks"] = torch_requirements(frameworks, accelerator if isinstance(accelerator, str) else None)
        opts["gpus"] = gpus
        if not opts.get("name") and isinstance(entry, str) and text_problem(entry) is None:
            opts["name"] = entry  # a bad entry is reported once, as the entry
        if nproc_per_node is None:
            # one process per device, unless told otherwise
            nproc_per_node = gpus if isinstance(gpus, int) and gpus > 0 else 1
        job = joboptions.distributed_job(entry, self.args, cast(JobOptions, opts), spelling, nodes=nodes,
                                         nproc_per_node=nproc_per_node, launcher=launcher)
        self.bundle = job.bundle
        _check_entry(entry, self.bundle)
        self.entry = entry
        self.nodes = job.nodes
        self.nproc_per_node = job.nproc_per_node
        self.job: CommandJob | DistributedJob = job
        if job.nodes == 1 and job.nproc_per_node == 1 and launcher is None:  # (a launcher named is wanted)
            # the same checked fields (the placement record as is: its target may be unset)
            fields = {name: getattr(job, name) for name in CommandJob.model_fields if name not in ("kind", "command")}
            self.job = CommandJob(command=["python", "-c", SINGLE_PROCESS_SHIM, entry, *self.args], **fields)

    @property
    def distributed(self) -> bool:
        return self.job.kind == "distributed"

    def submit(self) -> Any:
        """Submit the job; returns its :class:`~gpulayer.sdk.JobHandle` at once."""
        from gpulayer.sdk import connect, submit

        if self._client is None:
            self._client = connect()
        self.handle = submit(self.job, client=self._client)
        return self.handle

    def fit(self, *, timeout: float | None = None, stream: bool = True,
            out: IO[str] | None = None, err: IO[str] | None = None) -> JobRecord:
        """Submit, stream the job's output while waiting, and return the final record.

        Lines of a multi-node job are prefixed ``[node R]``. Raises
        :class:`~gpulayer.errors.JobFailed` when the job fails, times out, is cancelled or
        its worker is lost with no retry left; :class:`TimeoutError` when ``timeout``
        seconds pass first (the job runs on: ``self.handle.cancel()`` ends it). A Ctrl-C
        while it waits cancels the job, every node's processes with it, as ``gpulayer
        submit`` does, and the :class:`KeyboardInterrupt` goes on.
        """
        import time

        from gpulayer.client import prefixes_nodes
        from gpulayer.logtext import NodeLines
        from gpulayer.sdk import result_of, wait_limit

        timeout = wait_limit(timeout, "Trainer.fit")  # (checked before anything is submitted)
        handle = self.submit() if self.handle is None else self.handle
        client = self._client
        deadline = None if timeout is None else time.monotonic() + timeout
        lines = NodeLines(prefixes_nodes(self.job))

        def check_deadline(job: JobRecord) -> None:
            if deadline is not None and time.monotonic() > deadline and not job.state.terminal:
                job = client.job(handle.id, brief=True)  # (what follow looked at may be a second old)
                if not job.state.terminal:
                    raise TimeoutError(f"job {handle.id} is still {job.state.value} after {timeout} s")

        def write(to: str, text: str) -> None:
            sink = (err or sys.stderr) if to == "stderr" else (out or sys.stdout)
            sink.write(text)
            sink.flush()

        try:
            try:
                for c in client.follow(handle.id, stream=stream, on_update=check_deadline):
                    write(c.stream, lines.text(c.data, c.node_rank, c.stream))
            finally:  # (a Ctrl-C or the timeout too: what each node printed last is shown)
                for to, rest in lines.rest():
                    write(to, rest)
        except KeyboardInterrupt:
            # as `gpulayer submit` does: a Ctrl-C while the run streams ends the run (every
            # node's processes), not only this wait; left running, it held its workers
            from gpulayer.leaving import cancel_all

            cancel_all(client, [handle.id], "the process that submitted it was interrupted while Trainer.fit() "
                       "waited for it")
            raise
        job: JobRecord = client.api.get_job(handle.id)
        result_of(job)  # raises JobFailed / Unschedulable / RemoteError unless it succeeded
        return job

    def __repr__(self) -> str:
        return (f"Trainer({self.entry!r}, nodes={self.nodes}, nproc_per_node={self.nproc_per_node}, "
                f"kind={self.job.kind})")


def launch(entry: str, **options: Unpack[TrainerOptions]) -> Any:
    """Submit a PyTorch entry on ``nodes`` x ``nproc_per_node`` processes; returns its
    :class:`~gpulayer.sdk.JobHandle` at once (``handle.result()`` waits; ``handle.logs()``).

    ``launch(entry, **options)`` is ``Trainer(entry, **options).submit()``: the same
    :class:`TrainerOptions`.
    """
    return Trainer._for(entry, options, "launch").submit()
