"""The web dashboard: jobs, one job with its live logs, workers, machines, the fleet.

Served by the same Starlette app as the API (``gpulayer server start`` at ``/``) and by
``gpulayer dashboard`` over the embedded control plane. It reads through the control plane's
operations with the visibility the API gives the same token, and takes a session cookie
made at the login where the API takes a bearer token (:mod:`.sessions`). Its pages are
Jinja2 templates (package data, autoescaped: :mod:`.views`), its live updates server-sent
events (:mod:`.live`), its routes listed once in :data:`ROUTES` (:mod:`.routes`); none of
them is an API operation or appears in the OpenAPI document. ``static/`` holds one CSS file
and one small plain-JavaScript file (no build step, nothing from a CDN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulayer.server.dashboard.routes import ROUTES, Dashboard, DashboardRoute

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from gpulayer.server.state import Server

__all__ = ["ROUTES", "DashboardOptions", "DashboardRoute", "routes"]


@dataclass(frozen=True)
class DashboardOptions:
    #: ``gpulayer dashboard``'s own login token (None: only the token store's tokens log in)
    run_token: str | None = None
    #: seconds between looks at the database when nothing in this process woke a live
    #: stream (changes by other processes: another server, the CLI beside ``gpulayer dashboard``)
    recheck: float = 5.0


def routes(server: Server, options: DashboardOptions) -> list[BaseRoute]:
    """The dashboard's routes over ``server``'s control plane."""
    return Dashboard(server, options).routes()
