"""Checked by mypy, not run (``[tool.mypy] files``): what a type checker makes of the SDK in a
user's program. ``@gl.remote`` returned ``Any``, so ``h.result()`` of a function declared to
return an int was ``Any``, and a call with a wrong argument type passed unnoticed; Ray's
``@ray.remote`` keeps both."""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

import gpulayer as gl
from gpulayer.records import JobRecord


@gl.remote
def square(x: int) -> int:
    return x * x


@gl.remote(cpus=1, name="words")
def words(text: str, *, upper: bool = False) -> list[str]:
    return (text.upper() if upper else text).split()


def typed_calls() -> None:
    h = square.remote(3)
    assert_type(h, gl.JobHandle[int])
    assert_type(h.result(), int)
    assert_type(h.result(timeout=5), int)
    assert_type(square(2), int)
    assert_type(square.options(name="sq", retries=2, after=h).remote(4).result(), int)
    assert_type(square.map([1, 2]), list[gl.JobHandle[int]])
    assert_type(words.remote("a b", upper=True).result(), list[str])
    assert_type(gl.get_job("job-0123456789ab"), gl.JobHandle[Any])
    assert_type(gl.wait([h]), list[JobRecord])
    assert_type(gl.wait([h], num_returns=1, timeout=5), tuple[list[gl.JobHandle[int]], list[gl.JobHandle[int]]])
    assert_type(next(gl.as_completed([h])), gl.JobHandle[int])
    square.remote("three")  # type: ignore[arg-type]
    words.remote("a", lower=True)  # type: ignore[call-arg]
