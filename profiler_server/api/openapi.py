"""The OpenAPI 3.1 document of the API, written from spec.py's declarations (served at
`/openapi.json`, the input of the schemathesis fuzz tests)."""

from __future__ import annotations

from profiler_core import __version__
from profiler_server.api.schemas import COMPONENTS
from profiler_server.api.spec import ENDPOINTS, Endpoint


def _operation(endpoint: Endpoint) -> dict:
    return {
        "operationId": endpoint.name,
        "summary": endpoint.summary,
        "parameters": [p.openapi() for p in endpoint.params],
        "responses": {
            str(status): {
                "description": answer.description,
                "content": {
                    media: {"schema": schema if schema is not None else {}}
                    for media, schema in answer.content.items()
                },
            }
            | ({"links": answer.links} if answer.links else {})
            for status, answer in endpoint.answers.items()
        },
    }


def document(endpoints: tuple[Endpoint, ...] = ENDPOINTS) -> dict:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "request-profiler server",
            "version": __version__,
            "description": "Stored requests, call trees, flame graphs and function totals "
            "(docs/api.md). Times are ISO-8601 UTC; every parameter is range-checked and a "
            'bad one answers 400 {"error": "<parameter>: <what was expected>"}.',
        },
        "paths": {e.path: {"get": _operation(e)} for e in endpoints},
        "components": {"schemas": COMPONENTS},
    }
