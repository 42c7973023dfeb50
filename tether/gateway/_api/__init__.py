"""The routes agents and the run call: one subpackage per API dialect (``openai``: chat and
text completions; ``responses``: OpenAI's Responses API; ``anthropic``: Messages), each with
its schema, request items, rendering and routes, plus the admin routes (``admin``)."""

__all__: list[str] = []
