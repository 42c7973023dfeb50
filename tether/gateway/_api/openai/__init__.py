"""OpenAI chat and text completions: the request schema (the canonical chat request the
other dialects convert to), response bodies, SSE streaming and the routes."""

__all__: list[str] = []
