"""Running the service: open the services, load the embedding model once, start the uploads'
enqueuer and the API keys' revocation listener, bind, and serve on hypercorn's Trio worker
until SIGTERM or SIGINT, then stop gracefully (requests in flight get hypercorn's graceful
timeout to end)."""

from __future__ import annotations

import ipaddress
import logging
import signal
from typing import Final

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from trioindex.api.index import Index
from trioindex.config import Settings
from trioindex.embedding.warm import lend_if_local
from trioindex.http.app import build_app
from trioindex.http.auth import Guard
from trioindex.http.context import Service
from trioindex.http.enqueuer import upload_enqueuer
from trioindex.http.key_cache import hear_revocations
from trioindex.services import open_services

logger = logging.getLogger(__name__)

GRACEFUL_SECONDS: Final = 10.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever reaches this machine (``--no-auth`` binds nowhere else)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> str:
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


async def _stop_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logger.info("serve: %s received, stopping", signal.Signals(signum).name)
            return


async def run_service(settings: Settings, *, host: str, port: int, auth: bool = True) -> None:
    """Serve until a stop signal. ``auth`` False (``--no-auth``) is refused off loopback."""
    if not auth and not is_loopback(host):
        raise ValueError("--no-auth serves on loopback only (127.0.0.1, ::1 or localhost)")
    async with open_services(settings) as services:
        index = Index(settings, services)
        try:
            embedder = await index.open_model()
            guard = Guard(services.db, auth, settings.http.webhook_token)
            uploads = upload_enqueuer(
                services.db,
                model_id=services.model.id,
                max_attempts=settings.worker.max_attempts,
            )
            app = build_app(Service(settings, services, index, guard, uploads))
            config = Config()
            config.bind = [_bind(host, port)]
            config.errorlog = logging.getLogger("hypercorn.error")
            config.accesslog = None
            config.graceful_timeout = GRACEFUL_SECONDS
            config.include_server_header = False
            logger.info(
                "serve: listening on http://%s (%s)",
                _bind(host, port),
                "API keys required" if auth else "NO authentication: --no-auth, loopback only",
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(uploads.serve)
                if auth:
                    await nursery.start(hear_revocations, services.direct_url, guard.keys)
                # this home's searches borrow a local model loaded here, as from a worker
                await nursery.start(lend_if_local, settings.embedding.api, settings.home, embedder)
                # returns once the requests in flight have ended (their enqueues included)
                await hypercorn_serve(app, config, shutdown_trigger=_stop_signal)  # type: ignore[arg-type]
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await index.aclose()
