"""SGLang's ``/generate`` JSON: the requests of one call and the answers read back.

What the fields mean and why they are sent so is in ``_sglang.py``'s docstring (the
sources read); :class:`~tether.engine._sglang.SGLangServer` does the HTTP around them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from tether.engine._protocol import Completion, EngineFailed, SamplingParams
from tether.engine._stream import TokenDelta

__all__ = ["NAME", "Answer", "finish_of", "request_bodies", "rids_of", "weight_version_of"]

NAME = "SGLang"


def weight_version_of(value: Any, url: str) -> int | None:
    """An integer weight version from SGLang's label (``"default"`` is 0)."""
    if value is None or str(value) == "default":
        return None if value is None else 0
    try:
        return int(str(value))
    except ValueError:
        raise EngineFailed(
            f"{NAME} server at {url} reports weight version {value!r}; tether needs integer "
            "versions: start it with --weight-version 0"
        ) from None


def rids_of(request_id: str, n: int) -> list[str]:
    width = len(str(n - 1))  # equal widths: no sibling's rid is a prefix of another's
    return [f"{request_id}#{i:0{width}d}" for i in range(n)]


def request_bodies(
    prompt_ids: Sequence[int],
    p: SamplingParams,
    rids: list[str],
    adapter: str | None,
    rng: random.Random,
) -> list[dict[str, Any]]:
    """The /generate requests of one call, one per completion: seeds ``seed + i``, or
    random ones when unseeded. The sampling keys with defaults are sent anyway (a
    server's ``--preferred-sampling-params`` would fill the ones left out)."""
    sampling: dict[str, Any] = dict(
        max_new_tokens=p.max_tokens,
        temperature=p.temperature,  # < 1e-6: greedy (SGLang: top_k 1, T 1)
        top_p=p.top_p,
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.0,
        ignore_eos=p.ignore_eos,
    )
    tag = p.constraint.structural_tag if p.constraint is not None else None
    optional = {"stop": list(p.stop), "stop_token_ids": list(p.stop_token_ids)}
    sampling.update((k, v) for k, v in {**optional, "structural_tag": tag}.items() if v)
    extra = {"top_logprobs_num": p.top_logprobs, "lora_path": adapter}
    base = {"input_ids": list(prompt_ids), "return_logprob": True}
    base.update((k, v) for k, v in extra.items() if v)
    out = []
    for i, rid in enumerate(rids):
        seed = rng.randrange(2**31) if p.seed is None else p.seed + i
        out.append({**base, "rid": rid, "sampling_params": {**sampling, "sampling_seed": seed}})
    return out


def finish_of(reason: Any, url: str) -> str | None:
    """tether's finish reason of SGLang's, None while running; an abort with an error
    status (a bad grammar, an overloaded server) is EngineFailed."""
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    if kind == "abort" and isinstance(reason, dict) and reason.get("status_code"):
        raise EngineFailed(f"{NAME} server at {url} failed the request: {reason.get('message')}")
    if kind in ("stop", "length", "abort"):
        return kind
    raise EngineFailed(f"{NAME} server at {url} sent an unknown finish reason {reason!r}")


class Answer:
    """One completion read from one (or, streaming, successive cumulative) answer."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[dict[int, float]] = []
        self.finish: str | None = None
        self.version: int | None = None

    def update(self, out: dict[str, Any], url: str) -> int:
        """Take an answer (the full output so far); return how many tokens are new."""
        meta = out.get("meta_info") or {}
        ids = [int(i) for i in out.get("output_ids") or []]  # through the stop token
        triples = (meta.get("output_token_logprobs") or [])[: len(ids)]
        if (
            len(triples) != len(ids)
            or any(int(t[1]) != i for t, i in zip(triples, ids, strict=True))
            or ids[: len(self.ids)] != self.ids  # a stream's events are cumulative
        ):
            raise EngineFailed(
                f"{NAME} server at {url} sent output_ids that do not match its logprobs "
                "or its earlier events (start it without --incremental-streaming-output)"
            )
        old = len(self.ids)
        self.ids = ids
        self.logprobs = [float(t[0]) for t in triples]
        tops = meta.get("output_top_logprobs") or []
        self.top = [{int(e[1]): float(e[0]) for e in row or []} for row in tops]
        self.finish = finish_of(meta.get("finish_reason"), url)
        version = weight_version_of(meta.get("weight_version"), url)
        self.version = self.version if version is None else version
        return len(ids) - old

    def deltas(self, index: int, new: int) -> list[TokenDelta]:
        out = []
        for k in range(len(self.ids) - new, len(self.ids)):
            top = self.top[k] if k < len(self.top) else None
            last = k == len(self.ids) - 1
            fin = self.finish if last else None
            out.append(TokenDelta(index, self.ids[k], self.logprobs[k], top, fin))
        return out

    def completion(self, top_logprobs: int) -> Completion:
        top = self.top if top_logprobs else None
        return Completion(self.ids, self.logprobs, self.finish or "abort", top)
