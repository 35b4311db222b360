"""Users' job specs: what a job runs, what it needs, and where it may run.

:class:`Requirements` (accelerator, devices, frameworks, host facts), :class:`Placement`
(target, fallback targets, what to do when nothing fits) and the three job kinds
:class:`CommandJob`, :class:`FunctionJob` and :class:`DistributedJob`. Everything here is
checked when it is built, with errors that name the field and what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Field, field_validator, model_validator

from gpulayer._base import Record
from gpulayer.errors import InvalidRequirement

# --------------------------------------------------------------------------- requirements

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_framework_spec(spec: str) -> tuple[str, str]:
    """``'torch>=2.2'`` -> ``('torch', '>=2.2')``; ``'jax'`` -> ``('jax', '')``.

    Raises :class:`InvalidRequirement` naming the spec and why when it cannot be parsed.
    """
    text = spec.strip()
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", text)
    if not m:
        raise InvalidRequirement(
            f"framework requirement {spec!r}: expected NAME or NAME followed by a PEP 440 "
            "version specifier, e.g. 'torch>=2.2' or 'jax'"
        )
    name, rest = m.group(1), m.group(2).strip()
    return name, check_specifier(rest, what=f"framework requirement {spec!r}")


def check_specifier(spec: str, *, what: str) -> str:
    """Return ``spec`` normalised, or raise :class:`InvalidRequirement` naming ``what``."""
    text = spec.strip()
    if not text:
        return ""
    try:
        SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise InvalidRequirement(
            f"{what}: {text!r} is not a PEP 440 version specifier ({exc}); "
            "accepted: comma-separated clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"
        ) from None
    if re.search(r"(==|!=|<=|>=|~=|===|<|>)\s*(,|$)", text) or text.endswith(","):
        raise InvalidRequirement(
            f"{what}: {text!r} has an operator with no version; "
            "accepted: clauses such as '>=2.2', '==2.3.*'"
        )
    return text


class Requirements(Record):
    """What a job needs from a worker. Every field is optional; empty means "anything"."""

    accelerator: str | None = Field(
        default=None, description="accelerator kind (cuda, rocm, mps, ...); None or 'cpu' = none"
    )
    gpus: int | None = Field(default=None, ge=0, description="devices per node; default 1 with an accelerator")
    min_gpu_memory_gb: float | None = Field(default=None, gt=0)
    compute_capability: str | None = Field(default=None, description="specifier, e.g. '>=8.0'")
    frameworks: dict[str, str] = Field(default_factory=dict)
    python: str | None = Field(default=None, description="specifier, e.g. '>=3.10'")
    os: str | None = None
    cpus: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    profile: str | None = Field(default=None, description="runtime profile applied at submit time")

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        if not _NAME_RE.match(v):
            raise ValueError(f"accelerator {v!r}: expected a kind such as 'cuda', 'rocm', 'mps' or 'cpu'")
        return None if v == "cpu" else v

    @field_validator("frameworks", mode="before")
    @classmethod
    def _frameworks(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            out: dict[str, str] = {}
            for item in v:
                name, spec = parse_framework_spec(str(item))
                out[name] = spec
            return out
        if isinstance(v, Mapping):
            out = {}
            for name, spec in v.items():
                if not isinstance(name, str) or not _NAME_RE.match(name):
                    raise ValueError(f"framework name {name!r}: expected a name such as 'torch' or 'torch.cuda'")
                out[name] = check_specifier(str(spec or ""), what=f"framework requirement {name!r}")
            return out
        return v

    @field_validator("compute_capability", "python")
    @classmethod
    def _spec(cls, v: str | None, info: Any) -> str | None:
        if v is None:
            return None
        if re.match(r"^\d+(\.\d+)*$", v.strip()):
            v = ">=" + v.strip()
        return check_specifier(v, what=f"{info.field_name} requirement") or None

    @field_validator("os")
    @classmethod
    def _os(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        aliases = {"macos": "darwin", "mac": "darwin", "osx": "darwin"}
        return aliases.get(v, v)

    @property
    def device_count(self) -> int:
        """Devices the job needs on each node."""
        if self.accelerator is None:
            return 0
        return 1 if self.gpus is None else self.gpus

    def merged(self, other: Requirements) -> Requirements:
        """``self`` with the fields ``other`` sets filled in where ``self`` leaves them empty."""
        data = self.model_dump(exclude_unset=True)
        for key, value in other.model_dump(exclude_unset=True).items():
            if key == "frameworks":
                data["frameworks"] = {**value, **data.get("frameworks", {})}
            elif key == "labels":
                data["labels"] = {**value, **data.get("labels", {})}
            elif data.get(key) is None:
                data[key] = value
        return Requirements.model_validate(data)


Target = Literal["local", "remote", "cloud"]
TARGETS: tuple[str, ...] = ("local", "remote", "cloud")


class Placement(Record):
    target: Target = "local"
    fallback_targets: list[Target] = Field(default_factory=list)
    on_unschedulable: Literal["fail", "wait"] = "fail"

    @model_validator(mode="after")
    def _distinct(self) -> Placement:
        seen = [self.target]
        for t in self.fallback_targets:
            if t in seen:
                raise ValueError(f"placement.fallback_targets: {t!r} is listed twice (with target {self.target!r})")
            seen.append(t)
        return self

    @property
    def targets(self) -> list[str]:
        return [self.target, *self.fallback_targets]


# --------------------------------------------------------------------------- job specs


class _JobBase(Record):
    name: str | None = Field(default=None, max_length=200)
    requirements: Requirements = Field(default_factory=Requirements)
    placement: Placement = Field(default_factory=Placement)
    timeout: float | None = Field(default=None, gt=0, description="seconds per attempt")
    retries: int = Field(default=0, ge=0, le=100, description="extra attempts after a failure or loss")
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    env: dict[str, str] = Field(default_factory=dict)
    bundle: str | None = Field(
        default=None,
        description="directory to send as a source bundle (a path on the submitting machine)",
    )
    bundle_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"env: {key!r} is not a valid environment variable name")
        return v


class CommandJob(_JobBase):
    """Run a command (an argv list), inside the source bundle when one is given."""

    kind: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("command: expected a list of arguments such as ['python', 'train.py'], not a string")
        return v


FUNCTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class FunctionJob(_JobBase):
    """Call ``module:function(*args, **kwargs)``; arguments and result are JSON."""

    kind: Literal["function"] = "function"
    function: str = Field(description="'package.module:function'")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    python: str | None = Field(default=None, description="interpreter to run it; default: the worker's job Python")

    @field_validator("function")
    @classmethod
    def _function(cls, v: str) -> str:
        if not FUNCTION_RE.match(v):
            raise ValueError(f"function: {v!r} is not 'module:function' (e.g. 'train:main' or 'pkg.mod:fn')")
        return v

    @model_validator(mode="after")
    def _json_args(self) -> FunctionJob:
        check_json(self.args, "args")
        check_json(self.kwargs, "kwargs")
        return self


class DistributedJob(_JobBase):
    """One coordinated workload over ``nodes`` workers, launched by a launcher plugin."""

    kind: Literal["distributed"] = "distributed"
    nodes: int = Field(default=1, ge=1, le=1024)
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    entry: str = Field(min_length=1, description="'train.py' or 'package.module:function'")
    args: list[str] = Field(default_factory=list)
    launcher: str = "torchrun"


JobSpec = Annotated[CommandJob | FunctionJob | DistributedJob, Field(discriminator="kind")]


def check_json(value: Any, path: str) -> None:
    """Raise :class:`~gpulayer.errors.InvalidArgument` at the first value that is not JSON.

    The message names the path of the offending value (``args[1]["weights"]``).
    """
    from gpulayer.errors import InvalidArgument

    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(
                f"{path}: {value!r} is not JSON (NaN and infinities are not allowed); "
                "accepted: None, bool, int, finite float, str, list, dict with str keys"
            )
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    f"{path}: key {key!r} is not a string; JSON objects have string keys"
                )
            check_json(item, f"{path}[{key!r}]".replace("'", '"'))
        return
    hint = ""
    if callable(value):
        hint = " (functions, lambdas and closures cannot be sent: see docs/adr/0002-json-only-arguments.md)"
    raise InvalidArgument(
        f"{path}: a {type(value).__name__} is not JSON{hint}; "
        "accepted: None, bool, int, finite float, str, list, dict with str keys"
    )


def job_spec_from_dict(data: Mapping[str, Any]) -> CommandJob | FunctionJob | DistributedJob:
    """Validate a job spec given as a plain mapping (from JSON)."""
    from pydantic import TypeAdapter

    spec: CommandJob | FunctionJob | DistributedJob = TypeAdapter(JobSpec).validate_python(data)
    return spec

