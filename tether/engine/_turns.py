"""The one rule for the token ids that end a generated turn.

The gateway passes them as stop ids, the embedded engine stops on them by
default, the fake engines end scripted turns with the first one, and the
starter model declares them as its ``eos_token_id``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["end_of_turn_ids"]

# End-of-turn / end-of-text tokens of common chat templates (ChatML, Llama 3, Llama 2, ...),
# in order of preference: the first one present ends a turn.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>")


def end_of_turn_ids(tokenizer: Any, model: Any = None) -> tuple[int, ...]:
    """Ids that end an assistant turn, the preferred first.

    The ``END_OF_TURN_TOKENS`` in ``tokenizer``'s vocabulary (in that
    order), then its ``eos_token_id``, then the ``eos_token_id`` (an id or a
    list) of ``model``'s generation config when a model is given. No
    duplicates; empty without a tokenizer and model.
    """
    ids: list[int] = []

    def add(token_id: Any) -> None:
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))

    if tokenizer is not None:
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        for text in END_OF_TURN_TOKENS:
            add(vocab.get(text))
        add(getattr(tokenizer, "eos_token_id", None))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for token_id in [eos] if isinstance(eos, int) else eos or []:
        add(token_id)
    return tuple(ids)
