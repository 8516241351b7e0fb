"""What every handler reaches through its request: the opened services, the index, the
settings and the guard (one :class:`Service` per running ``serve``)."""

from __future__ import annotations

import attrs
from starlette.requests import Request

from trioindex.api import Index
from trioindex.config import Settings
from trioindex.http.auth import Guard
from trioindex.services import Services


@attrs.frozen
class Service:
    """The state of one service: opened once at start, shared by every request."""

    settings: Settings = attrs.field(repr=False)
    services: Services
    index: Index
    guard: Guard


def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found
