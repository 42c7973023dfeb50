"""Write the HTTP API reference (docs/reference/http.md) from the gateway's OpenAPI schema.

    .venv/bin/python dev/httpdoc.py > docs/reference/http.md

The schema is the app's own (``create_app(...).openapi()``, the one the fuzzer tests
against); the version is left out so that a release does not make the page stale.
tests/test_docs.py fails when the page is out of date.
"""

from __future__ import annotations

import json
from typing import Any

HEADER = """\
# HTTP API reference

The gateway's routes, generated from its own OpenAPI schema by
`python dev/httpdoc.py > docs/reference/http.md` (`tests/test_docs.py` fails when this
page is out of date). A running gateway also serves the schema itself at
`GET /openapi.json` (with the admin key).

Every route but `/healthz` needs a bearer key: an agent's **rollout token** on
`/rollouts/{rollout_id}/...`, a **record key** on the record-mode routes (`/v1/...`), the
**admin key** on `/admin/...`. An agent's OpenAI base URL is
`{gateway}/rollouts/{rollout_id}/v1` and its Anthropic base URL the same without `/v1`;
`/rollouts/{rollout_id}/roles/{role}/v1` names the agent's role
([credit assignment](../credit.md)). Any `model` name is accepted: the gateway answers
with the model it serves, and `GET .../v1/models` lists it as `policy`.
"""


#: What each group of routes is for, and which key it takes (the schema's tags).
TAGS = {
    "health": "The only open route: whether the engine can serve calls.",
    "openai": "OpenAI-compatible routes an agent calls with its rollout token "
    "(`OPENAI_BASE_URL` = `{gateway}/rollouts/{rollout_id}/v1`).",
    "anthropic": "Anthropic's Messages API for an agent, with its rollout token "
    "(`ANTHROPIC_BASE_URL` = `{gateway}/rollouts/{rollout_id}`).",
    "rollouts": "A rollout's reward, from its agent (rollout token) or the admin.",
    "record": "Record mode: calls outside a rollout, with a record key "
    "(`tether serve --record-key KEY`), stored for later training or evaluation.",
    "admin": "The admin key's routes: create a rollout for an agent you start yourself, "
    "read rollouts and their calls, finish a rollout, pause and resume admission.",
}


def _type(schema: dict[str, Any]) -> str:
    """A JSON schema's type in a few words: ``string``, ``array of object``, ``int | null``."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(dict.fromkeys(_type(s) for s in schema[key]))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return kind


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields(body: dict[str, Any]) -> list[str]:
    required = set(body.get("required", []))
    rows = ["| field | type | required | default |", "|---|---|---|---|"]
    for name, prop in body.get("properties", {}).items():
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        yes = "yes" if name in required else ""
        rows.append(f"| `{name}` | {_type(prop)} | {yes} | {_cell(default)} |")
    return rows


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", op.get("summary", "")]
    if op.get("description"):
        lines += ["", op["description"].strip()]
    params = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
    if params:
        lines += ["", "Query parameters: " + ", ".join(f"`{p}`" for p in params) + "."]
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    if body.get("schema", {}).get("properties"):
        lines += ["", f"Request body (`{body['schema'].get('title', 'object')}`):", ""]
        lines += _fields(body["schema"])
    return [*lines, ""]


def http_markdown(schema: dict[str, Any]) -> str:
    """The HTTP reference page for an OpenAPI ``schema``."""
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            by_tag.setdefault(op.get("tags", ["other"])[0], []).append((path, method, op))
    out = [HEADER, "## Routes", "", "| method | path | what |", "|---|---|---|"]
    for tag, ops in by_tag.items():
        out += [f"| {m.upper()} | `{p}` | {tag}: {op.get('summary', '')} |" for p, m, op in ops]
    out += ["", _errors(schema)]
    for tag, ops in by_tag.items():
        out += [f"## {tag}", "", TAGS.get(tag, ""), ""]
        for path, method, op in ops:
            out += _operation(path, method, op)
    return "\n".join(out).rstrip() + "\n"


def _errors(schema: dict[str, Any]) -> str:
    """The error statuses, once: every route declares the same ones."""
    seen: dict[str, str] = {}
    for operations in schema["paths"].values():
        for op in operations.values():
            for status, response in op.get("responses", {}).items():
                if status >= "400":
                    seen.setdefault(status, response.get("description", ""))
    rows = "\n".join(f"| {s} | {_cell(d)} |" for s, d in sorted(seen.items()))
    return (
        '## Errors\n\nErrors carry OpenAI\'s body, `{"error": {"message", "type", '
        '"param", "code"}}` (Anthropic\'s on the Messages routes), with one of these '
        f"statuses:\n\n| status | when |\n|---|---|\n{rows}\n"
    )


def main() -> None:
    from tether.gateway import create_app

    app = create_app(None)  # type: ignore[arg-type]  # the schema needs no gateway behind it
    print(http_markdown(app.openapi()), end="")


if __name__ == "__main__":
    main()
