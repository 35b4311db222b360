"""README.md's Python snippet, pasted into a file and run exactly as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_readme_python_snippet_runs_as_pasted(home: Path, tmp_path: Path) -> None:
    [snippet] = python_blocks(README.read_text())
    (tmp_path / "main.py").write_text(snippet)
    env = {**os.environ, "GPULAYER_HOME": str(home)}
    proc = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["{'steps': 100, 'loss': 0.01}", "{'steps': 4, 'loss': 0.25}"]
