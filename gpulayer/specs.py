"""Users' job specs: what a job runs, what it needs, and where it may run.

:class:`Requirements` (accelerator, devices, frameworks, host facts), :class:`Placement`
(target, fallback targets, what to do when nothing fits) and the three job kinds
:class:`CommandJob`, :class:`FunctionJob` and :class:`DistributedJob`. Everything here is
checked when it is built.

Bad input is reported in GPUlayer's words, never pydantic's: every error is an
:class:`~gpulayer.errors.InvalidInput` (or a subclass) whose lines read
``INPUT: PROBLEM; accepted: WHAT``, where INPUT is written the way its user wrote it. A
:class:`Spelling` says how that is: ``CommandJob(timeout=inf)`` for a record built by hand,
``--timeout inf`` for ``gpulayer submit``, ``Trainer(gpus_per_node=-1)`` for the PyTorch
API (:mod:`gpulayer.joboptions` builds specs for every front end).

Text that cannot reach a process or the wire is refused here, wherever it appears: a NUL
byte (no argv or environment can hold one) and a lone surrogate (what a command-line
argument that is not UTF-8 decodes to; it cannot be encoded to send).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal, cast

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic._internal._model_construction import ModelMetaclass

from gpulayer._base import Record
from gpulayer.errors import InvalidArgument, InvalidInput, InvalidRequirement
from gpulayer.jobids import MAX_AFTER, JobId
from gpulayer.wording import ACCEPTED, TEXT, Spelling, build, invalid_input

__all__ = [
    "TARGETS",
    "CommandJob",
    "DistributedJob",
    "FunctionJob",
    "JobSpec",
    "Placement",
    "Requirements",
    "Spelling",
    "build",
    "check_framework_name",
    "check_framework_specifier",
    "check_json",
    "check_specifier",
    "check_text",
    "job_spec_from_dict",
    "parse_framework_spec",
    "split_framework_spec",
    "text_problem",
]

# --------------------------------------------------------------------------- text

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as text (a NUL byte, a lone surrogate), or None."""
    m = _BAD_CHAR.search(value)
    if m is None:
        return None
    if m.group() == "\x00":
        return f"contains a NUL byte at index {m.start()}"
    return f"is not valid UTF-8 (a lone surrogate {m.group()!r} at index {m.start()})"


_TEXT = TEXT


def check_text(value: str) -> str:
    """``value``, or :class:`InvalidInput` saying why it cannot be sent as text."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidInput(f"{problem}; accepted: {_TEXT}")
    return value


#: a str that can reach a process and the wire: no NUL byte, no lone surrogate
Text = Annotated[str, AfterValidator(check_text)]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name(value: str) -> str:
    if not _ENV_RE.match(value):
        raise InvalidInput("not an environment variable name; accepted: letters, digits and '_', "
                           "not starting with a digit")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


# --------------------------------------------------------------------------- requirements


def split_framework_spec(spec: str) -> tuple[str, str]:
    """``'torch>=2.2'`` -> ``('torch', '>=2.2')``; ``'jax'`` -> ``('jax', '')``.

    Raises :class:`InvalidRequirement` saying what is wrong, without naming ``spec`` (the
    caller names it the way its user wrote it).
    """
    problem = text_problem(spec)
    if problem is not None:
        raise InvalidRequirement(f"{problem}; accepted: {_TEXT}")
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", spec.strip())
    if not m:
        raise InvalidRequirement(
            "not a framework requirement; accepted: NAME or NAME followed by a PEP 440 version "
            "specifier, e.g. 'torch>=2.2' or 'jax'"
        )
    return m.group(1), check_specifier(m.group(2))


def parse_framework_spec(spec: str) -> tuple[str, str]:
    """``'torch>=2.2'`` -> ``('torch', '>=2.2')``; ``'jax'`` -> ``('jax', '')``.

    Raises :class:`InvalidRequirement` naming the spec and why when it cannot be parsed.
    """
    try:
        return split_framework_spec(spec)
    except InvalidRequirement as exc:
        raise InvalidRequirement(f"framework requirement {spec!r}: {exc}") from None


_SPECIFIER_EXAMPLES = "comma-separated clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"


def check_specifier(spec: str, *, accepted: str = _SPECIFIER_EXAMPLES) -> str:
    """Return ``spec`` normalised, or raise :class:`InvalidRequirement` saying what is wrong."""
    text = spec.strip()
    if not text:
        return ""
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise InvalidRequirement(f"{text!r} is not a PEP 440 version specifier; accepted: {accepted}") from None
    if re.search(r"(==|!=|<=|>=|~=|===|<|>)\s*(,|$)", text) or text.endswith(","):
        raise InvalidRequirement(f"{text!r} has an operator with no version; accepted: {accepted}")
    return text


class _Checked(ModelMetaclass):
    """Calling a users' record class (``CommandJob(...)``) words bad fields as :class:`InvalidInput`.

    Only the call converts, not ``model_validate`` (the server reading a request body, the
    store reading a row: their callers word pydantic's error, as :func:`build` does for the
    front ends). A metaclass rather than ``__init__``: pydantic sends nested records through
    a custom ``__init__`` too, which would turn their errors into text inside pydantic's.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            model = cast("type[BaseModel]", cls)
            raise invalid_input(exc, model, Spelling(call=model.__name__), kwargs) from None


class _UserRecord(Record, metaclass=_Checked):
    """A record users build by hand."""


class Requirements(_UserRecord):
    """What a job needs from a worker. Every field is optional; empty means "anything"."""

    accelerator: str | None = Field(
        default=None, description="accelerator kind (cuda, rocm, mps, ...); None or 'cpu' = none"
    )
    gpus: int | None = Field(default=None, ge=0, strict=True, description="devices per node; default 1 with an accelerator")
    min_gpu_memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True)
    compute_capability: Text | None = Field(default=None, description="specifier, e.g. '>=8.0'")
    frameworks: dict[str, str] = Field(default_factory=dict)
    python: Text | None = Field(default=None, description="specifier, e.g. '>=3.10'")
    os: Text | None = None
    cpus: int | None = Field(default=None, ge=0, strict=True)
    memory_gb: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    labels: dict[Text, Text] = Field(default_factory=dict)
    profile: Text | None = Field(default=None, description="runtime profile applied at submit time")

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        if not _NAME_RE.match(v):
            raise InvalidRequirement("not an accelerator kind; accepted: a kind such as 'cuda', 'rocm' or 'mps', "
                                     "or 'cpu' for none")
        return None if v == "cpu" else v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
            return v
        _at_most(v, "labels", "KEY=VALUE pairs")
        for key in v:
            if not key.strip() or "=" in key:
                raise InvalidRequirement(f"label key {key!r}: {'empty' if not key.strip() else 'holds an ='}; "
                                         "accepted: KEY=VALUE pairs with a KEY of text, not empty")
        return v

    @field_validator("frameworks")
    @classmethod
    def _frameworks_count(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if not checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
            _at_most(v, "frameworks", "frameworks")
        return v

    @field_validator("frameworks", mode="before")
    @classmethod
    def _frameworks(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        if isinstance(v, (list, tuple)):
            return dict(parse_framework_spec(item) if isinstance(item, str) else _not_text(item) for item in v)
        if isinstance(v, Mapping):
            return checked_frameworks(v)
        return v

    @field_validator("compute_capability", "python")
    @classmethod
    def _spec(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        if re.match(r"^\d+(\.\d+)*$", v.strip()):
            v = ">=" + v.strip()
        return check_specifier(v, accepted=ACCEPTED[f"Requirements.{info.field_name}"]) or None

    @field_validator("os")
    @classmethod
    def _os(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        if not v:  # (it read as "any OS": a `--os "$OS"` with OS unset)
            if checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
                return None
            raise InvalidRequirement("empty; accepted: an operating system such as linux or darwin (leave it out "
                                     "for any)")
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


#: the most labels, and the most frameworks, a job may require: a scheduler's explanation
#: tries each one left out against the fleet (its cost grows with the square of their number:
#: 500,000 labels in one ``POST /v1/explain`` kept a server's core busy for hours)
MAX_REQUIREMENT_ENTRIES = 100


def _at_most(entries: Mapping[str, str], what: str, accepted: str) -> None:
    if len(entries) > MAX_REQUIREMENT_ENTRIES:
        raise InvalidRequirement(f"{len(entries)} {what}; accepted: at most {MAX_REQUIREMENT_ENTRIES} {accepted}")


def checked_frameworks(frameworks: Mapping[Any, Any]) -> dict[str, str]:
    """``{name: specifier}`` with each name and specifier checked (the specifiers as
    :func:`check_framework_specifier` gives them), or :class:`InvalidRequirement` naming the
    framework: a job's ``frameworks`` and a runtime profile's."""
    out = {}
    for name, spec in frameworks.items():
        try:
            check_framework_name(name)
        except InvalidRequirement as exc:
            raise InvalidRequirement(f"framework name {name!r}: {exc}") from None
        try:
            out[name] = check_framework_specifier(spec)
        except InvalidRequirement as exc:
            raise InvalidRequirement(f"framework {name!r}: {exc}") from None
    return out


def check_framework_name(name: object) -> str:
    """``name`` if it names a framework (``torch``, ``torch.cuda``), else :class:`InvalidRequirement`
    saying what is accepted (the caller names the input)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidRequirement("not a framework name; accepted: a name such as 'torch' or 'torch.cuda'")
    return name


def check_framework_specifier(spec: object) -> str:
    """``spec`` (None or '' for any version) normalised, else :class:`InvalidRequirement`."""
    if spec is None:
        return ""
    if not isinstance(spec, str):
        raise InvalidRequirement("not text; accepted: a PEP 440 version specifier such as '>=2.2', or '' for any version")
    problem = text_problem(spec)
    if problem is not None:
        raise InvalidRequirement(f"{problem}; accepted: {_TEXT}")
    return check_specifier(spec)


def _not_text(item: object) -> tuple[str, str]:
    raise InvalidRequirement(f"{item!r} is not text; accepted: NAME or NAME followed by a PEP 440 version "
                             "specifier, e.g. 'torch>=2.2' or 'jax'")


Target = Literal["local", "remote", "cloud"]
TARGETS: tuple[str, ...] = ("local", "remote", "cloud")


class Placement(_UserRecord):
    target: Target = "local"
    fallback_targets: list[Target] = Field(default_factory=list)
    on_unschedulable: Literal["fail", "wait"] = "fail"
    #: the cloud target's offers to try first, in order: provider names (``ec2``), a provider
    #: and region (``ec2/us-west-2``) or whole scopes (``ec2/us-west-2/p5.48xlarge``)
    prefer: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(default_factory=list, max_length=50)

    @field_validator("fallback_targets")
    @classmethod
    def _distinct(cls, v: list[str], info: ValidationInfo) -> list[str]:
        target = info.data.get("target")
        seen: list[str] = []
        for t in v:
            if t == target or t in seen:
                why = "is the target already" if t == target else "is listed twice"
                raise InvalidInput(f"{t!r} {why}; accepted: targets other than the target, each listed once")
            seen.append(t)
        return v

    @property
    def targets(self) -> list[str]:
        return [self.target, *self.fallback_targets]


# --------------------------------------------------------------------------- job specs


class _JobBase(_UserRecord):
    name: Text | None = Field(default=None, max_length=200)
    requirements: Requirements = Field(default_factory=Requirements)
    placement: Placement = Field(default_factory=Placement)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True, description="seconds per attempt")
    retries: int = Field(default=0, ge=0, le=100, strict=True, description="extra attempts after a failure or loss")
    priority: int = Field(default=0, ge=-1000, le=1000, strict=True, description="higher runs first")
    env: dict[EnvName, Text] = Field(default_factory=dict)
    bundle: Text | None = Field(
        default=None, min_length=1,
        description="directory to send as a source bundle (a path on the submitting machine)",
    )
    bundle_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    #: the jobs it runs after: it is placed once each has succeeded, and fails without running
    #: if one ends otherwise (gpulayer.control.after). Written only when given: an older
    #: control plane refuses a field it does not know
    after: list[JobId] = Field(default_factory=list, max_length=MAX_AFTER, exclude_if=lambda after: not after)
    #: the same for jobs whose end, whatever it is, will do (Slurm's afterany: a job that
    #: cleans up or reports)
    after_ended: list[JobId] = Field(default_factory=list, max_length=MAX_AFTER, exclude_if=lambda ids: not ids)

    @field_validator("after", "after_ended")
    @classmethod
    def _after(cls, v: list[str], info: ValidationInfo) -> list[str]:
        other = info.data.get("after", []) if info.field_name == "after_ended" else []
        for i, job_id in enumerate(v):
            if job_id in v[:i]:
                raise InvalidInput(f"{job_id!r} is listed twice; accepted: each job once")
            if job_id in other:
                raise InvalidInput(f"{job_id!r} is in after too; accepted: each job in one of the two lists")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not v.strip():  # (it listed and showed as nothing at all)
            if checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
                return None
            raise InvalidInput("empty; accepted: a name of text (leave it out for a job without a name)")
        return v


class CommandJob(_JobBase):
    """Run a command (an argv list), inside the source bundle when one is given."""

    kind: Literal["command"] = "command"
    command: list[Text] = Field(min_length=1)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str):
            raise InvalidInput("a string, not a list of arguments; accepted: a list of arguments such as "
                               "['python', 'train.py']")
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], str) and not v[0].strip() \
                and not checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
            raise InvalidInput("the program to run is empty; accepted: a list of arguments whose first names the "
                               "program, such as ['python', 'train.py']")
        return v


FUNCTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class FunctionJob(_JobBase):
    """Call ``module:function(*args, **kwargs)``; arguments and result are JSON."""

    kind: Literal["function"] = "function"
    function: str = Field(description="'package.module:function'")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    python: Text | None = Field(default=None, description="interpreter to run it; default: the worker's job Python")

    @field_validator("function")
    @classmethod
    def _function(cls, v: str) -> str:
        if not FUNCTION_RE.match(v):
            raise InvalidInput("not 'module:function'; accepted: e.g. 'train:main' or 'pkg.mod:fn'")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v == "":  # (it ran the worker's own Python: a python=os.environ.get(...) with it unset)
            if checked_before(info):  # (a stored spec: taken when it was submitted, read as it is)
                return None
            raise InvalidInput("empty; accepted: the path of a Python interpreter on the worker (leave it out "
                               "for the worker's job Python)")
        return v

    @model_validator(mode="after")
    def _json_args(self, info: ValidationInfo) -> FunctionJob:
        if not checked_before(info):
            check_json(self.args, "args")
            check_json(self.kwargs, "kwargs")
        return self


class DistributedJob(_JobBase):
    """One coordinated workload over ``nodes`` workers, launched by a launcher plugin."""

    kind: Literal["distributed"] = "distributed"
    nodes: int = Field(default=1, ge=1, le=1024, strict=True)
    nproc_per_node: int = Field(default=1, ge=1, le=1024, strict=True)
    entry: Text = Field(min_length=1, description="'train.py' or 'package.module:function'")
    args: list[Text] = Field(default_factory=list)
    launcher: str = "torchrun"

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise InvalidInput("not a launcher name; accepted: the name of a distributed launcher such as 'torchrun'")
        return v


JobSpec = Annotated[CommandJob | FunctionJob | DistributedJob, Field(discriminator="kind")]

_JOB_KINDS: dict[str, type[CommandJob | FunctionJob | DistributedJob]] = {
    "command": CommandJob, "function": FunctionJob, "distributed": DistributedJob,
}

_JSON_TYPES = "None, bool, int, finite float, str, list, dict with str keys"


#: The validation context of specs whose arguments were checked when their job was
#: submitted: a spec read back from GPUlayer's own store, or from a control plane's answer
#: (:mod:`gpulayer.store.mapping`, the HTTP client). Their arguments are not walked again by
#: :func:`check_json`, a Python walk of every value (about 15 ms for 1 MB of arguments),
#: which pydantic would otherwise repeat at every read, and again wherever a spec is put in
#: a record (a model's "after" validator runs for an instance passed to a field too).
#: What comes from a user (the SDK's constructors, a submit's request body) has no context,
#: and is checked.
CHECKED: Mapping[str, bool] = MappingProxyType({"gpulayer_arguments_checked": True})


def checked_before(info: ValidationInfo) -> bool:
    """Whether the validation is of a spec whose arguments were checked before (:data:`CHECKED`)."""
    context = info.context
    return isinstance(context, Mapping) and context.get("gpulayer_arguments_checked") is True


#: how deep arguments and results may nest (JSON parsers and pydantic recurse per level)
MAX_JSON_DEPTH = 100

#: the most digits an int argument may have: Python's default limit on converting an int to
#: and from text (``sys.int_info.default_max_str_digits``), which every reader (the control
#: plane, the worker, the job's Python) parses the arguments under
MAX_INT_DIGITS = 4300
_TOO_BIG = 10**MAX_INT_DIGITS  # (the smallest int of MAX_INT_DIGITS + 1 digits)


def check_json(value: Any, path: str) -> None:
    """Raise :class:`~gpulayer.errors.InvalidArgument` at the first value that is not JSON.

    The message names the path of the offending value (``args[1]["weights"]``). A string
    with a lone surrogate is refused too (it cannot be encoded to be sent), and so is
    nesting deeper than :data:`MAX_JSON_DEPTH`. The path is only built for the value at
    fault, so checking a long list costs no string per item.
    """
    problem = _json_problem(value, 0)
    if problem is not None:
        steps, message = problem
        parts = [f"[{s}]" if isinstance(s, int) else f'["{s}"]' for s in reversed(steps)]
        if len(parts) > 12:  # a deeply nested value: its path's ends say enough
            parts = [*parts[:6], f"...({len(parts) - 8} more)...", *parts[-2:]]
        raise InvalidArgument(f"{path}{''.join(parts)}: {message}")


def _json_problem(value: Any, depth: int) -> tuple[list[str | int], str] | None:
    """``(steps from value to the bad part, in reverse, what is wrong)`` or None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if -_TOO_BIG < value < _TOO_BIG:
            return None
        return [], (f"an int of more than {MAX_INT_DIGITS} digits; accepted: an int of at most "
                    f"{MAX_INT_DIGITS} digits (send a larger one as a str)")
    if isinstance(value, str):
        if _SURROGATE.search(value):
            return [], f"{value!r} {text_problem(value)}; accepted: valid Unicode text"
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return [], f"{value!r} is not JSON (NaN and infinities are not allowed); accepted: {_JSON_TYPES}"
        return None
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_JSON_DEPTH:
        return [], f"nested more than {MAX_JSON_DEPTH} levels deep; accepted: JSON nested at most {MAX_JSON_DEPTH} levels"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if item is None or type(item) is bool or (type(item) is int and -_TOO_BIG < item < _TOO_BIG):
                continue  # the common case, without a call
            found = _json_problem(item, depth + 1)
            if found is not None:
                found[0].append(i)
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return [], f"key {key!r} is not a string; JSON objects have string keys"
            if _SURROGATE.search(key):
                return [], f"key {key!r} {text_problem(key)}; accepted: valid Unicode text"
            found = _json_problem(item, depth + 1)
            if found is not None:
                found[0].append(key)
                return found
        return None
    if type(value).__name__ == "JobHandle" and type(value).__module__ == "gpulayer.sdk":
        return [], (f"a JobHandle ({getattr(value, 'id', '?')}) is not JSON; a handle does not stand for its "
                    "job's result here as a Ray ObjectRef does: pass the result (h.result(), which waits for "
                    "it), or run after the job and pass its id (f.options(after=h).remote(h.id)), which the "
                    "function reads with gl.get_job(job_id).result()")
    hint = ""
    if callable(value):
        hint = " (functions, lambdas and closures cannot be sent: see docs/adr/0002-json-only-arguments.md)"
    return [], f"a {type(value).__name__} is not JSON{hint}; accepted: {_JSON_TYPES}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def job_spec_from_dict(data: Mapping[str, Any]) -> CommandJob | FunctionJob | DistributedJob:
    """Validate a job spec given as a plain mapping (from JSON); bad input is :class:`InvalidInput`."""
    kind = data.get("kind") if isinstance(data, Mapping) else None
    model = _JOB_KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise InvalidInput(f"kind={kind!r}: not a job kind; accepted: {', '.join(_JOB_KINDS)}")
    return build(model, data, Spelling(call=model.__name__))


# what each field accepts, in the words errors use (wording.ACCEPTED)
from gpulayer import spec_words  # noqa: E402,F401
