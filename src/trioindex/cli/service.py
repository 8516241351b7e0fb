"""Commands of the HTTP service: ``serve`` and ``keys create|list|revoke``."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from trioindex.cli.common import (
    JsonFlag,
    app,
    command_settings,
    database_call,
    friendly,
    print_json,
    run,
)


@app.command()
@friendly
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (0.0.0.0: every interface).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = 8080,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Answer without API keys (binds to loopback only: for one machine)."
        ),
    ] = False,
    json_logs: Annotated[bool, typer.Option(help="Log one JSON object per line.")] = False,
) -> None:
    """Serve the HTTP API: upload, delete, list, search, jobs, status, bucket notifications.

    Every request needs an API key (`trioindex keys create NAME --role read|write|admin`)
    except GET /healthz; the embedding model is loaded once, at start. SIGTERM or Ctrl-C stops
    it gracefully.
    """
    from trioindex.http.server import is_loopback, run_service

    if no_auth and not is_loopback(host):
        raise typer.BadParameter(
            "--no-auth serves on loopback only (127.0.0.1, ::1 or localhost); create API keys"
            " to serve on other addresses",
            param_hint="'--host'",
        )
    settings = command_settings(json_logs)
    run(functools.partial(run_service, settings, host=host, port=port, auth=not no_auth))


keys_app = typer.Typer(no_args_is_help=True, help="API keys of the HTTP service (`serve`).")
app.add_typer(keys_app, name="keys")

ROLE_HELP = "read: search, status, documents, jobs; write: + upload, delete; admin: + retry jobs."


@keys_app.command("create")
@friendly
def keys_create(
    name: Annotated[str, typer.Argument(help="A name for the key (who or what uses it).")],
    role: Annotated[str, typer.Option(help=ROLE_HELP)] = "read",
    as_json: JsonFlag = False,
) -> None:
    """Create an API key and print its token, once: only a hash of it is stored."""
    from trioindex.db.api_keys import Role, create_key

    if role not in {r.value for r in Role}:
        raise typer.BadParameter("must be read, write or admin", param_hint="'--role'")
    settings = command_settings(quiet=True)
    key, token = database_call(settings, create_key, name, Role(role))
    if as_json:
        print_json({"name": key.name, "role": key.role.value, "id": str(key.id), "token": token})
        return
    typer.echo(token)
    typer.echo(
        f"created key {key.name!r} ({key.role}); the token above is shown only now:"
        " send it as `Authorization: Bearer TOKEN`",
        err=True,
    )


@keys_app.command("list")
@friendly
def keys_list(as_json: JsonFlag = False) -> None:
    """Every API key with its role, and when it was created or revoked (never a token)."""
    from trioindex.db.api_keys import list_keys

    keys = database_call(command_settings(quiet=True), list_keys)
    if as_json:
        print_json(keys)
        return
    if not keys:
        typer.echo("no API keys (create one: trioindex keys create NAME --role read)")
    for key in keys:
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        typer.echo(f"{key.name:30} {key.role:6} created {key.created_at:%Y-%m-%d %H:%M}  {state}")


@keys_app.command("revoke")
@friendly
def keys_revoke(name: Annotated[str, typer.Argument(help="The key's name.")]) -> None:
    """Revoke an API key: the service refuses it from now on."""
    from trioindex.db.api_keys import revoke_key

    key = database_call(command_settings(quiet=True), revoke_key, name)
    typer.echo(f"revoked key {key.name!r}")
