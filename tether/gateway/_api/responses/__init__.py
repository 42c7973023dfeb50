"""OpenAI's Responses API (docs/responses-api.md): schema, input items, rendering and
the routes."""

__all__: list[str] = []
