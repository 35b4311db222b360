"""The self-hosted control plane: a Starlette app over one :class:`~gpulayer.control.ControlPlane`.

See :mod:`gpulayer.server.app` and docs/server.md.
"""

from gpulayer.server.app import API_PREFIX, create_app

__all__ = ["API_PREFIX", "create_app"]
