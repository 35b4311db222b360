"""``gpulayer token create | list | revoke``: manage a server's API tokens (admin token)."""

from __future__ import annotations

import time
from typing import Any, Optional

import typer

from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import echo_json, json_option
from gpulayer.cli.display import printable
from gpulayer.errors import InvalidInput

token_app = typer.Typer(help=help_of("token"),
                        no_args_is_help=True, rich_markup_mode=None)


#: what the API takes (:class:`gpulayer.wire.TokenBody`, not imported here: it loads pydantic)
MAX_USES = 10**9
MAX_DESCRIPTION = 500


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")


def _admin() -> Any:
    from gpulayer import config
    from gpulayer.http_client import connect_http

    env = config.settings()
    if not env.url:
        raise InvalidInput("tokens live on a server: give --url URL (or set GPULAYER_URL)")
    return connect_http(env.url, token=env.token, ca=env.ca, retry_for=5.0)


@token_app.command("create")
def token_create(
    join: bool = typer.Option(False, "--join", help="a join token for workers (multi-use, expires)"),
    client: bool = typer.Option(False, "--client", help="a client token: submit and read its own jobs"),
    bootstrap: bool = typer.Option(False, "--bootstrap", help="a single-use join token for a booted machine"),
    admin: bool = typer.Option(False, "--admin", help="another admin token"),
    ttl: Optional[str] = typer.Option(None, "--ttl", help="lifetime such as 30m, 24h, 7d (join default 24h)"),
    uses: Optional[int] = typer.Option(None, "--uses", min=1, max=MAX_USES, help="at most this many uses (join)"),
    description: str = typer.Option("", "--description", "-d", metavar="TEXT",
                                    help=f"what the token is for (at most {MAX_DESCRIPTION} characters)"),
    as_json: bool = json_option("print the new token's record, secret included, as JSON"),
) -> None:
    """Create a token; its secret is printed once."""
    from gpulayer.units import parse_duration

    chosen = [name for name, on in (("join", join), ("client", client), ("bootstrap", bootstrap),
                                    ("admin", admin)) if on]
    if len(chosen) != 1:
        raise typer.BadParameter("choose exactly one of --join, --client, --bootstrap, --admin")
    scope = chosen[0]
    if uses is not None and scope not in ("join",):
        raise typer.BadParameter("--uses applies to --join tokens", param_hint="--uses")
    if len(description) > MAX_DESCRIPTION:  # (the server's words named create_token: description)
        raise InvalidInput(f"--description: {len(description)} characters; accepted: text of at most "
                           f"{MAX_DESCRIPTION} characters")
    try:
        seconds = parse_duration(ttl) if ttl else None
    except InvalidInput as exc:
        raise InvalidInput(f"--ttl {ttl}: {str(exc).split(': ', 1)[-1]}") from None
    new = _admin().create_token(scope=scope, ttl=seconds, uses=uses,
                                description=description)
    if as_json:
        typer.echo(new.model_dump_json(indent=2))
        return
    typer.echo(new.token)
    extra = []
    if new.expires_at:
        extra.append("expires " + time.strftime("%Y-%m-%d %H:%M", time.localtime(new.expires_at)))
    if new.uses_left is not None:
        extra.append(f"{new.uses_left} use(s)")
    typer.echo(f"{scope} token {new.id}{' (' + ', '.join(extra) + ')' if extra else ''}; "
               "the secret above is shown only once", err=True)


@token_app.command("list")
def token_list(as_json: bool = json_option()) -> None:
    """Tokens on the server (never their secrets)."""
    rows = _admin().list_tokens()
    if as_json:
        echo_json([t.model_dump(mode="json") for t in rows])
        return
    typer.echo(f"{'ID':<18}{'SCOPE':<11}{'STATE':<10}{'EXPIRES':<18}{'USES':<6}{'WORKER':<18}DESCRIPTION")
    now = time.time()
    for t in rows:
        state = ("revoked" if t.revoked else "expired" if t.expires_at and t.expires_at <= now
                 else "used up" if t.uses_left == 0 else "active")
        exp = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.expires_at)) if t.expires_at else "-"
        uses = "-" if t.uses_left is None else str(t.uses_left)
        typer.echo(f"{t.id:<18}{t.scope:<11}{state:<10}{exp:<18}{uses:<6}{t.worker_id or '-':<18}"
                   f"{printable(t.description)}")


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., metavar="TOKEN", help="token id (tok-...)"),
                 as_json: bool = json_option("print the revoked token's record as JSON")) -> None:
    """Revoke a token: it is refused from now on."""
    if token_id.strip().startswith("glt_"):
        # (sent, the secret went into a URL, where proxies log paths, and the answer was "no
        # such token": a leaked secret looked harmless while it still worked)
        raise InvalidInput("TOKEN: that is a token's secret (glt_...), not its id; give its id (tok-...), as "
                           "'gpulayer token list' shows it (the secret was not sent)")
    t = _admin().revoke_token(token_id)
    if as_json:
        echo_json(t)
        return
    typer.echo(f"revoked {t.id} ({t.scope})")
