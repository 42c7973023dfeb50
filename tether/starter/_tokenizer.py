"""The starter tokenizer: byte-level BPE trained on a synthetic corpus.

Pre-tokenization isolates runs of up to three digits (``\\p{N}{1,3}``, as in
cl100k), then maps bytes to the byte-level alphabet without further
splitting, so a number tokenizes the same wherever it appears and any text
(unicode included) encodes. The corpus is calc transcripts rendered with the
chat template, plus generated English-like and ASCII text. Training is
deterministic for a seed.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast

from tether.starter import calc
from tether.starter._template import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
)

__all__ = ["PRETOKENIZE_PATTERN", "TokenizerRecipe", "build_tokenizer"]

# cl100k-style split: contractions, words (with one leading non-letter), digit
# runs of at most 3, punctuation runs, newlines, other whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class TokenizerRecipe:
    """Everything the tokenizer depends on (part of the cache key)."""

    vocab_size: int = 1664  # including the special and added tokens
    seed: int = 0
    n_transcripts: int = 3000
    n_text_lines: int = 6000
    min_frequency: int = 2
    model_max_length: int = 2048

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_WORD_TEXT = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left
late run while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
yes distant fill east paint language among total sum result compute tool function error value
please thanks sorry hello okay assistant user system model agent task reply message content
"""
_WORDS = tuple(_WORD_TEXT.split())

_PUNCT_END = (".", ".", ".", "?", "!", ":", ";", ",")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 10 ** rng.randint(1, 6))))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(_PUNCT_END)


def _text_line(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.7:
        return " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
    if roll < 0.85:  # code-ish / JSON-ish
        key, val = rng.choice(_WORDS), rng.choice(_WORDS)
        return rng.choice(
            [
                f'{{"{key}": "{val}", "{val}": {rng.randint(0, 999)}}}',
                f"def {key}_{val}(x, y):\n    return x {rng.choice('+-*/')} y",
                f"{key} = [{', '.join(str(rng.randint(0, 99)) for _ in range(4))}]",
                f"- {key}: {val} ({rng.randint(1, 100)}%)",
            ]
        )
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(5, 60)))


def fingerprint() -> str:
    """A digest of the general-text generator's vocabulary (part of the cache key)."""
    blob = json.dumps([_WORDS, _PUNCT_END, PRETOKENIZE_PATTERN])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def corpus(recipe: TokenizerRecipe) -> Iterator[str]:
    """The training texts: rendered calc transcripts and general text, without special tokens."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rng = random.Random(f"tether-tokenizer-corpus:{recipe.seed}")
    problems = calc.make_problems(recipe.n_transcripts, "train", seed=10_000 + recipe.seed)
    strip = (*SPECIAL_TOKENS, *ADDED_TOKENS)
    for problem in problems:
        messages = calc.transcript(problem, rng.choice(calc.TRANSCRIPT_KINDS), rng)
        rendered, _ = render_jinja_template(
            [messages], tools=[calc.CALCULATOR_TOOL], chat_template=CHAT_TEMPLATE
        )
        text = rendered[0]
        for token in strip:
            text = text.replace(token, "\n")
        yield text
    for _ in range(recipe.n_text_lines):
        yield _text_line(rng)


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build_tokenizer(recipe: TokenizerRecipe | None = None) -> PreTrainedTokenizerFast:
    """Train the BPE tokenizer and wrap it with the chat template (a few seconds)."""
    recipe = recipe or TokenizerRecipe()
    tok = _empty_tokenizer()
    trainer = BpeTrainer(
        vocab_size=recipe.vocab_size - len(ADDED_TOKENS),
        min_frequency=recipe.min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(recipe), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=recipe.model_max_length,
        clean_up_tokenization_spaces=False,
    )
