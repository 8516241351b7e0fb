"""What every handler reaches through its request: the opened services, the index, the
settings, the guard and the uploads' enqueuer (one :class:`Service` per running ``serve``)."""

from __future__ import annotations

import attrs
from starlette.requests import Request

from trioindex.api.index import Index
from trioindex.config import Settings
from trioindex.http.auth import Guard
from trioindex.http.enqueuer import UploadEnqueuer
from trioindex.services import Services


@attrs.frozen
class Service:
    """The state of one service: opened once at start, shared by every request."""

    settings: Settings = attrs.field(repr=False)
    services: Services
    index: Index
    guard: Guard
    uploads: UploadEnqueuer


def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found
