"""Anthropic's Messages API (docs/anthropic.md): schema, content blocks, rendering and
the routes."""

__all__: list[str] = []
