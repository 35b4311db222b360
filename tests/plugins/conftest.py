from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(gpulayer_isolated: None) -> None:
    """Each test sees only the hardware its fixtures fake, even on a real GPU machine."""
