"""Running a CLI command in a fresh interpreter and telling which path answered it: the
light one (gpulayer.cli.light, no Typer, pydantic, SQLAlchemy, SQLModel or pluggy
imported) or the full one (tests/unit/test_cli_light.py, test_cli_detect_light.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROBE = """
    import atexit, sys
    heavy = ("typer", "pydantic", "sqlalchemy", "sqlmodel", "pluggy")
    atexit.register(lambda: sys.stderr.write("\\nPATH=" + ("full" if set(heavy) & set(sys.modules) else "light")))
    sys.argv = ["gpulayer", *ARGS]
    if ENTRY == "main":
        from gpulayer.cli import main
        main()
    else:
        from gpulayer.cli.root import app
        app()
"""

#: ``(exit code, stdout, stderr without the marker, "light" or "full")``
Result = tuple[int, bytes, str, str]


def run_cli(args: list[str], home: Path, *, entry: str = "main", env: dict[str, str] | None = None,
            timeout: float = 180) -> Result:
    """``gpulayer ARGS`` on ``home`` (no other GPULAYER_* setting of this process), through
    ``gpulayer.cli.main`` (``entry="main"``: the light path when it can) or the Typer app
    itself (``"app"``: always the full path)."""
    code = textwrap.dedent(PROBE).replace("ARGS", repr(args)).replace("ENTRY", repr(entry))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    full_env.update({"GPULAYER_HOME": str(home), "GPULAYER_CLI_SERVER_IDLE": "0", **(env or {})})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=timeout, cwd=home, env=full_env)
    err, _, path = proc.stderr.decode().rpartition("\nPATH=")
    return proc.returncode, proc.stdout, err, path
