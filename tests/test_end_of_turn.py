"""One rule for the ids that end a generated turn (gateway stop ids, engine defaults,
scripted turns, the starter's eos)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tether.engine import end_of_turn_ids
from tether.engine.testing import ScriptedEngine


class _Vocab:
    """A tokenizer's two attributes the rule reads."""

    def __init__(self, vocab: dict[str, int], eos: int | None):
        self.vocab, self.eos_token_id = vocab, eos

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_the_starter_ends_turns_with_im_end_then_endoftext(tokenizer: Any) -> None:
    im_end, eot = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert end_of_turn_ids(tokenizer) == (im_end, eot)
    assert ScriptedEngine(["x"], tokenizer).end_token_id == im_end


def test_named_tokens_first_then_eos_then_the_generation_config() -> None:
    llama3 = _Vocab({"<|eot_id|>": 9, "<|end_of_text|>": 7, "hi": 1}, eos=7)
    assert end_of_turn_ids(llama3) == (9, 7)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, 3]))
    assert end_of_turn_ids(llama3, model) == (9, 7, 3)
    model.generation_config.eos_token_id = 4
    assert end_of_turn_ids(_Vocab({}, eos=None), model) == (4,)
    assert end_of_turn_ids(None) == () and ScriptedEngine(["x"]).end_token_id is None
