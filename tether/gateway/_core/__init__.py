"""The gateway's core, without HTTP: :class:`~.gateway.Gateway` (rollouts, keys,
admission), model calls (render, generate, stream, record), request preparation and
structured-output constraints. No FastAPI here; the dialects and the app build on it."""

__all__: list[str] = []
