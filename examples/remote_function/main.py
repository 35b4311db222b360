"""``@gl.remote`` with a source bundle: run ``python main.py`` from this directory.

The function is imported by name on the worker from the bundle (this directory), so it
can use the other modules here. Arguments and the result are JSON.
"""

from stats import summarize

import gpulayer as gl


@gl.remote(timeout=60, retries=1)
def analyse(values: list[float]) -> dict[str, float]:
    return summarize(values)


@gl.remote
def fails() -> None:
    raise RuntimeError("this one fails on purpose")


if __name__ == "__main__":
    print("here:  ", analyse([1.0, 2.0, 3.0, 4.0]))        # a plain call runs in this process
    handles = [analyse.remote([float(i), float(i) * 2, 3.0]) for i in range(4)]
    for h in gl.as_completed(handles):
        print("remote:", h.id, h.result())
    try:
        fails.remote().result()
    except gl.RemoteError as err:
        print("remote error came back:", err.remote_type, "-", err.remote_message)
