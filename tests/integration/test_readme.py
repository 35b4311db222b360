"""README.md's Python snippet, pasted into a file and run exactly as written, and what it
prints (tests/integration/test_doc_snippets.py runs every other snippet; README.md marks
this one ``<!-- run: by=tests/integration/test_readme.py -->``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docsnippets import ROOT, snippets


def test_the_readme_python_snippet_runs_as_pasted(home: Path, tmp_path: Path) -> None:
    [snippet] = [s for s in snippets([ROOT / "README.md"]) if s.lang == "python"]
    assert snippet.options.get("by") == "tests/integration/test_readme.py"
    (tmp_path / "main.py").write_text(snippet.body)
    env = {**os.environ, "GPULAYER_HOME": str(home)}
    proc = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["{'steps': 100, 'loss': 0.01}", "{'steps': 4, 'loss': 0.25}",
                                       "[{'steps': 1, 'loss': 1.0}, {'steps': 2, 'loss': 0.5}]"]
