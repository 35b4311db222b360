"""Users' job specs built by hand: bad fields raise GPUlayer's InvalidInput in its own words,
with the field as written, the bad value and what is accepted; never pydantic's text."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from pydantic import ValidationError

import gpulayer as gl
from gpulayer.errors import InvalidArgument, InvalidInput, InvalidRequirement
from gpulayer.specs import CommandJob, FunctionJob, Placement, Requirements, job_spec_from_dict

#: pydantic's own words, none of which may reach a user
RESIDUE = ("Value error", "Input should", "errors.pydantic.dev", "validation error", "[type=")
JSON = "None, bool, int, finite float, str, list, dict with str keys"
TEXT = "UTF-8 text without NUL bytes"


def refused(make: Callable[[], object], kind: type[Exception] = InvalidInput) -> str:
    with pytest.raises(InvalidInput) as info:
        make()
    assert type(info.value) is kind, (type(info.value), str(info.value))
    text = str(info.value)
    for word in RESIDUE:
        assert word not in text, text
    return text


JSON = "None, bool, int, finite float, str, list, dict with str keys"
TEXT = "UTF-8 text without NUL bytes"

HAND_BUILT: list[tuple[Callable[[], object], type[Exception], str]] = [
    (lambda: FunctionJob(function="m:f", args=[{1, 2}]), InvalidArgument,
     f"args[0]: a set is not JSON; accepted: {JSON}"),
    (lambda: FunctionJob(function="m:f", kwargs={"x": "\ud800"}), InvalidArgument,
     "kwargs[\"x\"]: '\\ud800' is not valid UTF-8 (a lone surrogate '\\ud800' at index 0); accepted: valid Unicode text"),
    (lambda: FunctionJob(function="nope"), InvalidInput,
     "FunctionJob(function='nope'): not 'module:function'; accepted: e.g. 'train:main' or 'pkg.mod:fn'"),
    (lambda: CommandJob(command=["echo", "a\x00b"]), InvalidInput,
     f"CommandJob(command[1]='a\\x00b'): contains a NUL byte at index 1; accepted: {TEXT}"),
    (lambda: CommandJob(command=["echo", "\ud800"]), InvalidInput,
     f"CommandJob(command[1]='\\ud800'): is not valid UTF-8 (a lone surrogate '\\ud800' at index 0); accepted: {TEXT}"),
    (lambda: CommandJob(command="ls -l"), InvalidInput,
     "CommandJob(command='ls -l'): a string, not a list of arguments; accepted: a list of arguments such as "
     "['python', 'train.py']"),
    (lambda: CommandJob(command=["", "x"]), InvalidInput,
     "CommandJob(command=['', 'x']): the program to run is empty; accepted: a list of arguments whose first names "
     "the program, such as ['python', 'train.py']"),
    (lambda: Requirements(labels={"": "v"}), InvalidRequirement,
     "Requirements(labels={'': 'v'}): label key '': empty; accepted: KEY=VALUE pairs with a KEY of text, not empty"),
    (lambda: CommandJob(), InvalidInput,
     "CommandJob(command): missing; accepted: a list of arguments such as ['python', 'train.py']"),
    (lambda: CommandJob(command=["true"], timeout=math.inf), InvalidInput,
     "CommandJob(timeout=inf): not a finite number; accepted: a number of seconds > 0 (leave it out for no limit)"),
    (lambda: CommandJob(command=["true"], timeout=-1), InvalidInput,
     "CommandJob(timeout=-1): must be more than 0; accepted: a number of seconds > 0 (leave it out for no limit)"),
    (lambda: CommandJob(command=["true"], env={"A-B": "1"}), InvalidInput,
     "CommandJob(env={'A-B': '1'}): not an environment variable name; accepted: letters, digits and '_', "
     "not starting with a digit"),
    (lambda: CommandJob(command=["true"], env={"A": "x\x00"}), InvalidInput,
     f"CommandJob(env={{'A': 'x\\x00'}}): contains a NUL byte at index 1; accepted: {TEXT}"),
    (lambda: CommandJob(command=["true"], name="\ud800"), InvalidInput,
     f"CommandJob(name='\\ud800'): is not valid UTF-8 (a lone surrogate '\\ud800' at index 0); accepted: {TEXT}"),
    (lambda: CommandJob(command=["true"], gpus=1), InvalidInput,
     "CommandJob(gpus=1): no such field; accepted: name, requirements, placement, timeout, retries, priority, "
     "env, bundle, bundle_digest, after, after_ended, kind, command"),
    (lambda: CommandJob(command=["true"], requirements={"gpus": -1}), InvalidRequirement,
     "CommandJob(requirements.gpus=-1): must be at least 0; accepted: a whole number >= 0 (devices per node)"),
    (lambda: Requirements(gpus=1.5), InvalidRequirement,
     "Requirements(gpus=1.5): not a whole number; accepted: a whole number >= 0 (devices per node)"),
    (lambda: Requirements(memory_gb=math.nan), InvalidRequirement,
     "Requirements(memory_gb=nan): not a finite number; accepted: a number of GB >= 0"),
    (lambda: Requirements(frameworks=["torch>>2"]), InvalidRequirement,
     "Requirements(frameworks=['torch>>2']): framework requirement 'torch>>2': '>>2' is not a PEP 440 version "
     "specifier; accepted: comma-separated clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"),
    (lambda: Requirements(compute_capability="eight"), InvalidRequirement,
     "Requirements(compute_capability='eight'): 'eight' is not a PEP 440 version specifier; accepted: a version "
     "such as 8.0 (meaning >=8.0) or PEP 440 clauses such as '>=8.0,<9'"),
    (lambda: Placement(target="moon"), InvalidInput,
     "Placement(target='moon'): not one of the choices; accepted: local, remote or cloud"),
    (lambda: Placement(target="remote", fallback_targets=["remote"]), InvalidInput,
     "Placement(fallback_targets=['remote']): 'remote' is the target already; accepted: targets other than the "
     "target, each listed once"),
    (lambda: gl.DistributedJob(entry="train.py", nodes=0), InvalidInput,
     "DistributedJob(nodes=0): must be at least 1; accepted: a whole number from 1 to 1024"),
    # no silent conversions: True was a one-second timeout, "2" two nodes
    (lambda: gl.DistributedJob(entry="train.py", nodes="2"), InvalidInput,
     "DistributedJob(nodes='2'): not a whole number; accepted: a whole number from 1 to 1024"),
    (lambda: gl.DistributedJob(entry="train.py", nproc_per_node=True), InvalidInput,
     "DistributedJob(nproc_per_node=True): not a whole number; accepted: a whole number from 1 to 1024"),
    (lambda: CommandJob(command=["true"], timeout=True), InvalidInput,
     "CommandJob(timeout=True): not a number; accepted: a number of seconds > 0 (leave it out for no limit)"),
    (lambda: CommandJob(command=["true"], retries="1"), InvalidInput,
     "CommandJob(retries='1'): not a whole number; accepted: a whole number from 0 to 100"),
    (lambda: Requirements(gpus=True), InvalidRequirement,
     "Requirements(gpus=True): not a whole number; accepted: a whole number >= 0 (devices per node)"),
]


@pytest.mark.parametrize(("make", "kind", "message"), HAND_BUILT, ids=[m for _, _, m in HAND_BUILT])
def test_hand_built_specs_refuse_bad_fields_in_our_words(make: Callable[[], object], kind: type[Exception],
                                                         message: str) -> None:
    assert refused(make, kind) == message


def test_every_error_of_one_record_is_reported_once_per_line() -> None:
    text = refused(lambda: CommandJob(command=["true"], retries=-1, priority=5000))
    assert text.splitlines() == [
        "CommandJob(retries=-1): must be at least 0; accepted: a whole number from 0 to 100",
        "CommandJob(priority=5000): must be at most 1000; accepted: a whole number from -1000 to 1000",
    ]


def test_validating_stored_data_still_raises_pydantics_error_for_its_caller_to_word() -> None:
    # the server and the store word these themselves; only calling the class converts
    with pytest.raises(ValidationError):
        CommandJob.model_validate({"command": ["true"], "timeout": -1})
    spec = CommandJob.model_validate({"command": ["true"], "requirements": {"gpus": 2}})
    assert spec.requirements.gpus == 2


def test_good_hand_built_specs_are_unchanged() -> None:
    job = CommandJob(command=["python", "train.py"], timeout=5, env={"A": "1"},
                     requirements=Requirements(accelerator="CUDA", python="3.10", os="macOS"))
    assert job.requirements.accelerator == "cuda"
    assert job.requirements.python == ">=3.10"
    assert job.requirements.os == "darwin"
    assert FunctionJob(function="m:f", args=["\x00 is JSON"]).args == ["\x00 is JSON"]
    assert "target" not in CommandJob(command=["true"]).placement.model_fields_set



def test_a_spec_from_a_mapping_is_worded_the_same() -> None:
    assert refused(lambda: job_spec_from_dict({"kind": "command", "command": ["true"], "retries": -1})) == (
        "CommandJob(retries=-1): must be at least 0; accepted: a whole number from 0 to 100")
    assert refused(lambda: job_spec_from_dict({"kind": "batch"})) == (
        "kind='batch': not a job kind; accepted: command, function, distributed")


def test_arguments_nested_too_deep_are_refused_naming_where() -> None:
    import gpulayer as gl
    from gpulayer.errors import InvalidArgument

    deep: object = 1
    for _ in range(3000):  # deeper than Python's recursion limit
        deep = [deep]
    with pytest.raises(InvalidArgument) as e:
        gl.FunctionJob(function="m:f", args=[deep])
    assert str(e.value) == ("args[0][0][0][0][0][0]...(92 more)...[0][0]: nested more than 100 levels deep; "
                            "accepted: JSON nested at most 100 levels")
    shallow: object = 1
    for _ in range(99):
        shallow = [shallow]
    gl.FunctionJob(function="m:f", args=shallow)  # type: ignore[arg-type]


def test_an_int_argument_too_long_to_write_as_json_is_refused_naming_where() -> None:
    """An int of more digits than Python converts to text by default was accepted and then
    failed the submit with json's bare ValueError, naming no argument."""
    import gpulayer as gl
    from gpulayer.errors import InvalidArgument
    from gpulayer.specs import MAX_INT_DIGITS

    big = 10**MAX_INT_DIGITS  # MAX_INT_DIGITS + 1 digits
    for args, kwargs, where in (([big], {}, "args[0]"), ([1, [2, -big]], {}, "args[1][1]"),
                                ([], {"n": {"k": big}}, 'kwargs["n"]["k"]')):
        with pytest.raises(InvalidArgument) as e:
            gl.FunctionJob(function="m:f", args=args, kwargs=kwargs)
        assert str(e.value) == (f"{where}: an int of more than {MAX_INT_DIGITS} digits; accepted: an int of "
                                f"at most {MAX_INT_DIGITS} digits (send a larger one as a str)")
    most = big - 1  # MAX_INT_DIGITS digits
    assert gl.FunctionJob(function="m:f", args=[most, [-most]], kwargs={"n": most}).args[0] == most
