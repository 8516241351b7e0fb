"""``/openapi.json``: the OpenAPI 3.1 description of every route, built from the route table
(:data:`trioindex.http.app.ENDPOINTS`), so a route cannot exist without its description."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trioindex.http.app import Endpoint

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}


def _parameter(name: str, where: str, description: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if name.endswith("[]"):
        name = name[:-2]
        schema = {"type": "array", "items": {"type": "string"}}
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


def document(endpoints: Sequence[Endpoint], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        path = endpoint.path.replace(":path}", "}")
        parameters = [_parameter(name, "path", "") for name in _path_names(path)] + [
            _parameter(name, "query", text) for name, text in endpoint.query
        ]
        operation: dict[str, Any] = {
            "summary": endpoint.summary,
            "operationId": endpoint.handler.__module__.rsplit(".", 1)[-1]
            + "_"
            + endpoint.handler.__name__,
            "parameters": parameters,
            "responses": {
                "200": {"description": "success (JSON, except /metrics)"},
                "default": {
                    "description": "an error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
            "security": [] if endpoint.role is None else [{"apiKey": []}],
        }
        if endpoint.role is not None:
            operation["x-trioindex-role"] = str(endpoint.role)
        if endpoint.body is not None:
            operation["requestBody"] = {
                "description": endpoint.body,
                "required": True,
                "content": {
                    endpoint.body_type: {}
                    if endpoint.body_schema is None
                    else {"schema": endpoint.body_schema}
                },
            }
        paths.setdefault(path, {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "trioindex", "version": version},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key from `trioindex keys create NAME --role ROLE`",
                }
            },
        },
    }


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]
