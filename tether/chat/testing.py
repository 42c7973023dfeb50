"""Test helpers: a tiny ChatML tokenizer that builds in milliseconds.

For tests of tether and of users' own code that need a real Hugging Face
tokenizer with a chat template and tool-call tokens, without the starter
model::

    from tether.chat.testing import tiny_chat_tokenizer
    tok = tiny_chat_tokenizer()
    ids = tether.chat.render_prompt(tok, [{"role": "user", "content": "hi"}])

The tokenizer is byte-level BPE (any text encodes and decodes back exactly),
trained on a few sentences; its template is Qwen2.5's (:data:`QWEN25_TEMPLATE`),
which renders ``tool_calls[].function.arguments`` with ``tojson`` and so
needs them as dicts, the case :func:`tether.chat.normalize_messages` exists for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["QWEN25_TEMPLATE", "SPECIAL_TOKENS", "tiny_chat_tokenizer"]

#: Qwen2.5-Instruct's chat template, abridged only in its tools preamble and default system prompt.
QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools><|im_end|>\\n" }}'
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first)'
    ' or (message.role == "assistant" and not message.tool_calls) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}'
    "{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}'
    '{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}'
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    '{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}'
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: The special tokens, each a single id; ``<|im_end|>`` is EOS, ``<|endoftext|>`` is padding.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")

_CORPUS = (
    "You are a helpful assistant.",
    'What is 3 + 4? {"name": "calculator", "arguments": {"expression": "3 + 4"}}',
    "The answer is 7. Let me compute that with the calculator tool.",
)


def tiny_chat_tokenizer(corpus: Iterable[str] = _CORPUS, *, vocab_size: int = 400) -> Any:
    """A ``PreTrainedTokenizerFast`` with :data:`QWEN25_TEMPLATE` and :data:`SPECIAL_TOKENS`.

    Byte-level BPE trained on ``corpus``; ``clean_up_tokenization_spaces`` is off,
    so ``decode(encode(text)) == text`` for any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = QWEN25_TEMPLATE
    return tok
