"""The gateway's OpenAPI schema: bearer auth and OpenAI error bodies declared.

FastAPI's generated schema lists neither. Declaring them lets a client (or a
schema fuzzer) know that every route but ``/healthz`` needs a bearer key and
which error statuses carry the ``{"error": {...}}`` body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

__all__ = ["install_openapi"]

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
# Statuses any route may answer with an error body; 401/403 only where a key is needed.
_ERRORS = {
    "400": "invalid request (bad JSON, a field beyond a cap, a malformed rollout id)",
    "404": "no such rollout or route",
    "405": "method not allowed",
    "409": "conflict: a duplicate reward, a finished rollout, a stale attempt",
    "413": "request body above the cap",
    "500": "gateway set-up error",
    "502": "the engine failed",
    "503": "paused longer than the admission timeout, or the store is unavailable",
    "504": "the engine did not answer within the timeout",
}
_AUTH_ERRORS = {
    "401": "missing or invalid key, or a token whose rollout has ended",
    "403": "a valid key of the wrong kind (another rollout's token, the admin key on an agent route)",
}
OPEN_PATHS = ("/healthz",)


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def install_openapi(app: FastAPI) -> None:
    """Replace ``app.openapi`` by one that adds the bearer scheme and the error responses."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "a rollout's token, the admin key, or a record key",
            }
        }
        for path, operations in schema.get("paths", {}).items():
            for op in operations.values():
                responses = op.setdefault("responses", {})
                responses.pop("422", None)  # validation errors are answered as 400
                for status, text in _ERRORS.items():
                    responses.setdefault(status, _error(text))
                if path not in OPEN_PATHS:
                    op["security"] = [{"bearer": []}]
                    for status, text in _AUTH_ERRORS.items():
                        responses.setdefault(status, _error(text))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
