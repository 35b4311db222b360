"""A worker's FunctionJob files: each task's function spec (when it does not travel in the
forked child's request) and its result, in one private folder (mode 0700) the worker keeps
for its life. Not a temporary folder per task: on a journaled file system making and
removing a folder for each task cost more than the rest of a no-op task's files (0.25 ms)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from pathlib import Path

__all__ = ["INLINE_SPEC_MAX", "TaskFiles"]

#: the largest function spec (its arguments, as JSON) a forked task gets in its request
#: rather than in a file
INLINE_SPEC_MAX = 64 * 1024


class TaskFiles:
    """The private folder of one worker (made on first use, removed by :meth:`close`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.folder: Path | None = None

    def paths(self, task_id: str) -> tuple[Path, Path]:
        """Where the task's spec and its result go."""
        with self._lock:
            if self.folder is None or not self.folder.is_dir():
                self.folder = Path(tempfile.mkdtemp(prefix="gpulayer-worker-"))
            folder = self.folder
        return folder / f"{task_id}.spec.json", folder / f"{task_id}.json"

    def remove(self, task_id: str) -> None:
        """The task's files: its spec, its result, and a result the runner was killed while
        writing (``<result>.tmp-<pid>``, see function_runner)."""
        folder = self.folder
        if folder is None:
            return
        with contextlib.suppress(OSError):
            (folder / f"{task_id}.spec.json").unlink()
        try:
            (folder / f"{task_id}.json").unlink()
        except FileNotFoundError:  # never renamed into place: a half-written one may be left
            for left in folder.glob(f"{task_id}.json.tmp-*"):
                with contextlib.suppress(OSError):
                    left.unlink()
        except OSError:
            pass

    def close(self) -> None:
        """Remove the folder (the worker stopped)."""
        with self._lock:
            folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
