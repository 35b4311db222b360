"""``@gl.remote`` on a function defined under a script's ``if __name__ == "__main__":``.

A worker imports the script by name, which does not run that block: the function was
accepted, submitted, and failed on the worker with "module 'train' has no attribute ...".
It is refused at decoration, in the script's own process, before anything is submitted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "GPULAYER_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_function_under_the_main_guard_is_refused_at_decoration(tmp_path: Path) -> None:
    proc = run_script(tmp_path, """
        import gpulayer as gl

        if __name__ == "__main__":
            @gl.remote(cpus=1)
            def train(steps):
                return steps

            print("submitted", train.remote(1).id)
    """)
    assert proc.returncode == 1 and "submitted" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        f'gpulayer.errors.InvalidArgument: @gl.remote: train is defined under `if __name__ == "__main__":` '
        f"in {tmp_path.resolve() / 'train.py'}; a worker imports that file by name, which does not run "
        "that block, so it could not find train. Define it above the guard, at the top level of the module "
        "(see docs/adr/0002-json-only-arguments.md)")
    assert not (tmp_path / "home" / "gpulayer.db").exists()


def test_functions_outside_the_guard_are_accepted(tmp_path: Path) -> None:
    proc = run_script(tmp_path, """
        import gpulayer as gl

        @gl.remote
        def first(x):
            return x

        if "__main__" != __name__:  # not the guard
            @gl.remote
            def second(x):
                return x

        class Steps:
            @gl.remote
            def third(x):
                return x

        if "__main__" == __name__:
            print(first.function, Steps.third.function)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["train:first", "train:Steps.third"]
