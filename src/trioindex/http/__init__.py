"""The HTTP service, ``trioindex serve``: Starlette routes on hypercorn's Trio worker, over the
same database, store and (loaded once) embedding model as the CLI.

One module per concern:

* ``app`` — the route table (method, path, role, handler, what OpenAPI says of it) and the
  application built from it: every route is guarded by its role in one place;
* ``server`` — opening the services, loading the model, binding and a graceful stop;
* ``auth`` — API keys per request (``Authorization: Bearer``), roles, the webhook's token;
  ``key_cache`` — verified keys kept while the service hears revocations;
* ``errors`` — the JSON error body, its stable codes, and which error maps to which;
* ``limits`` — the bounds: body sizes, concurrent requests, query length, ``top_k``, and
  checked reading of parameters;
* ``upload`` — a request body (or one part of a batch) spooled and hashed as it arrives;
  ``enqueuer`` — uploads stored, then enqueued in groups; ``batch`` — many documents in one
  multipart/form-data request, one result per part;
* ``documents``, ``search``, ``operations``, ``monitor``, ``hooks`` — the handlers;
* ``console`` — the web console's static files and its sign-in; ``session`` — console sessions
  (the cookie, its CSRF token) that stand for an API key;
* ``metrics`` — Prometheus counters of requests; ``openapi`` — ``/openapi.json``.

Nothing here imports Starlette at package import: the CLI imports it only for ``serve``.
"""
