"""The ``search(query)`` tool: BM25 over the shipped documents (``docs.jsonl``).

The index is `bm25s <https://github.com/xhluca/bm25s>`_ (BM25, Lucene
variant, numpy backend), built once per process from the title and text of
each document; English stop words are dropped. ``search``
returns the best ``k`` documents with a positive score, as the text the model
reads::

    >>> print(search("Who founded Lumzar?", k=1))
    [town-00] Lumzar: Lumzar is a harbour town on ...
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import bm25s

DOCS = Path(__file__).resolve().with_name("docs.jsonl")
MAX_QUERY_CHARS = 200
DEFAULT_K = 1

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the encyclopedia of the Tessaly Isles for articles.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "keywords, e.g. Lumzar founded"}
            },
            "required": ["query"],
        },
    },
}


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class DocIndex:
    """A BM25 index over documents ``{"id", "title", "text"}``."""

    def __init__(self, docs: list[dict[str, str]]) -> None:
        if not docs:
            raise ValueError("DocIndex needs at least one document")
        self.docs = docs
        self.retriever = bm25s.BM25()
        self.retriever.index(
            _tokens([f"{d['title']}. {d['text']}" for d in docs]), show_progress=False
        )

    @classmethod
    def from_jsonl(cls, path: Path) -> DocIndex:
        return cls([json.loads(line) for line in path.read_text().splitlines() if line.strip()])

    def search(self, query: str, k: int = DEFAULT_K) -> list[tuple[dict[str, str], float]]:
        """The best ``k`` documents for ``query`` with their scores, best first (score > 0)."""
        k = max(1, min(k, len(self.docs)))
        ids, scores = self.retriever.retrieve(_tokens([query]), k=k, show_progress=False)
        return [
            (self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0
        ]


@functools.lru_cache(maxsize=4)
def load_index(path: Path = DOCS) -> DocIndex:
    """The index of ``path``, built once per process."""
    return DocIndex.from_jsonl(path)


def search(query: str, k: int = DEFAULT_K, index: DocIndex | None = None) -> str:
    """The tool as the agent runs it: one line per hit, or ``error: …`` / a no-match line."""
    if not isinstance(query, str) or not query.strip():
        return "error: query must be a non-empty string"
    if len(query) > MAX_QUERY_CHARS:
        return f"error: query is longer than {MAX_QUERY_CHARS} characters"
    hits = (index or load_index()).search(query, k)
    if not hits:
        return f"no article matches {query!r}; try other keywords"
    return "\n".join(f"[{d['id']}] {d['title']}: {d['text']}" for d, _ in hits)
