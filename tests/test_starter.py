"""tether.starter: tokenizer, chat template, model, cache, warm-up (tiny)."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tether.starter as starter
from tether.models import load_model, load_tokenizer
from tether.starter import (
    Recipe,
    WarmupRecipe,
    build_starter,
    calc,
    is_starter,
    starter_path,
)
from tether.starter._build import MARKER_FILE
from tether.starter._evaluate import parse_tool_calls, run_episodes
from tether.starter._model import ModelRecipe, build_model, count_parameters, stop_token_ids
from tether.starter._template import ADDED_TOKENS, CHAT_TEMPLATE, ENDOFTEXT, IM_END, IM_START
from tether.starter._tokenizer import build_tokenizer
from tether.starter._warmup import encode_transcript, plan

TEXTS = [
    "12345 + 7 = 12352",
    "x12345y, (12345), 12345.678 and -12345",
    "ünïcødé ✓ 日本語 emoji 🙂 tabs\tand\nnewlines\r\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * (4 + 5)"}}\n</tool_call>',
    "<tool_response>\n27\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "",
]


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("starter-cache")


@pytest.fixture(scope="session")
def base_path(cache: Path) -> Path:
    return build_starter(cache_dir=cache)


@pytest.fixture(scope="session")
def tokenizer(base_path: Path):
    return load_tokenizer(base_path)


def render(tokenizer, messages, **kw) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=[calc.CALCULATOR_TOOL], tokenize=False, **kw
    )
    return tokenizer.encode(text, add_special_tokens=False)


def test_calc_imports_without_torch() -> None:
    code = "import sys, tether.starter.calc; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_folder_is_marked_and_cached(cache: Path, base_path: Path) -> None:
    assert base_path == starter_path(cache_dir=cache)
    assert is_starter(base_path)
    names = {p.name for p in base_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_FILE} <= names
    info = json.loads((base_path / MARKER_FILE).read_text())
    assert info["warm"] is False and info["stop_token_ids"] == [2, 0]
    mtime = (base_path / MARKER_FILE).stat().st_mtime_ns
    assert build_starter(cache_dir=cache) == base_path  # cached: not rebuilt
    assert (base_path / MARKER_FILE).stat().st_mtime_ns == mtime
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]  # no staging leftovers


def test_cache_key_follows_recipe_and_env(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = Recipe(model=ModelRecipe(seed=1))
    assert starter_path(cache_dir=cache, recipe=other) != starter_path(cache_dir=cache)
    assert starter_path(cache_dir=cache, warm=True) != starter_path(cache_dir=cache)
    warm_other = Recipe(warmup=WarmupRecipe(seed=1))
    assert starter_path(cache_dir=cache, recipe=warm_other) == starter_path(cache_dir=cache)
    assert starter_path(cache_dir=cache, warm=True, recipe=warm_other) != starter_path(
        cache_dir=cache, warm=True
    )
    monkeypatch.setenv("TETHER_CACHE", str(cache / "env"))
    assert starter_path().parent == cache / "env" / "starter"
    # a change to the task generators (the tokenizer corpus, the warm-up data) is a new build
    before = starter_path(cache_dir=cache)
    monkeypatch.setattr(calc, "_TEMPLATES", calc._TEMPLATES[:-1])
    assert starter_path(cache_dir=cache) != before


def test_special_and_added_tokens_are_single_ids(tokenizer) -> None:
    for token in (ENDOFTEXT, IM_START, IM_END, *ADDED_TOKENS):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids) == [token]
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT
    assert stop_token_ids(tokenizer) == [
        tokenizer.convert_tokens_to_ids(IM_END),
        tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    ]
    # tool-call markers survive skip_special_tokens, so a parser sees them
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"
    assert 1500 <= len(tokenizer) <= 2048


def test_numbers_tokenize_the_same_everywhere(tokenizer) -> None:
    want = tokenizer.tokenize("12345")
    assert want == tokenizer.tokenize("123") + tokenizer.tokenize("45")
    for context in ["x{}y", " {} ", "({})", '"{}"', "a={}.", "-{}", "\n{}\n"]:
        toks = tokenizer.tokenize(context.format("12345"))
        joined = [t for t in toks if any(c.isdigit() for c in t)]
        assert joined == want, context
        assert all(t.isdigit() for t in joined)


def test_any_text_round_trips(tokenizer) -> None:
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_reloaded_tokenizer_matches_the_built_one(base_path: Path, tokenizer) -> None:
    fresh = build_tokenizer(Recipe().tokenizer)  # the in-memory object before save_pretrained
    for text in TEXTS:
        assert tokenizer.encode(text) == fresh.encode(text), text
    messages = calc.transcript(calc.make_problems(1, "val")[0], "clean", _rng())
    assert render(tokenizer, messages) == render(fresh, messages)
    assert tokenizer.chat_template == fresh.chat_template == CHAT_TEMPLATE
    # tokenizing inside apply_chat_template gives the same ids as render + encode
    direct = tokenizer.apply_chat_template(messages, tools=[calc.CALCULATOR_TOOL], tokenize=True)
    assert direct["input_ids"] == render(tokenizer, messages)


def test_autotokenizer_trap_is_avoided(base_path: Path, tokenizer) -> None:
    # AutoTokenizer picks Qwen2Tokenizer from model_type=qwen2 and splits
    # digits one by one; load_tokenizer must not.
    from transformers import AutoTokenizer

    assert len(tokenizer.tokenize("12345")) < 5
    assert type(tokenizer).__name__ != "Qwen2Tokenizer"
    auto = AutoTokenizer.from_pretrained(str(base_path))
    if auto.tokenize("12345") != tokenizer.tokenize("12345"):  # the trap is still there
        assert len(auto.tokenize("12345")) == 5


def test_load_tokenizer_falls_back_to_autotokenizer(tmp_path: Path, tokenizer) -> None:
    tokenizer.save_pretrained(tmp_path)  # no marker, no config.json
    plain = load_tokenizer(tmp_path)
    assert not is_starter(tmp_path)
    assert plain.encode("hello 123") == tokenizer.encode("hello 123")


def _rng() -> random.Random:
    return random.Random(0)


# ----------------------------------------------------------- chat template


def _tool_call(expression: str, as_string: bool) -> dict:
    message = calc.tool_call_message(expression)
    if as_string:
        fn = message["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps(fn["arguments"])
    return message


@pytest.mark.parametrize("as_string", [False, True])
def test_rendering_extends_prompt_plus_completion(tokenizer, as_string: bool) -> None:
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    problem = calc.make_problems(1, "val")[0]
    messages = [
        {"role": "system", "content": calc.SYSTEM_PROMPT},
        {"role": "user", "content": problem.question},
    ]
    p1 = render(tokenizer, messages, add_generation_prompt=True)
    # the model's canonical completion, as the tokenizer splits it, ending in <|im_end|>
    call_text = (
        '<tool_call>\n{"name": "calculator", "arguments": '
        + calc.tool_arguments_json(problem.expression)
        + "}\n</tool_call>"
    )
    c1 = [*tokenizer.encode(call_text, add_special_tokens=False), im_end]
    # the gateway parses the call back (arguments as a dict, or the SDK's JSON string)
    messages += [
        _tool_call(problem.expression, as_string),
        {"role": "tool", "tool_call_id": "call_0", "content": str(problem.answer)},
    ]
    p2 = render(tokenizer, messages, add_generation_prompt=True)
    assert p2[: len(p1) + len(c1)] == p1 + c1
    # and the final answer turn extends the second prompt the same way
    c2 = [*tokenizer.encode(f"The answer is {problem.answer}.", add_special_tokens=False), im_end]
    messages.append({"role": "assistant", "content": f"The answer is {problem.answer}."})
    p3 = render(tokenizer, [*messages, {"role": "user", "content": "thanks"}])
    assert p3[: len(p2) + len(c2)] == p2 + c2


def test_template_renders_like_qwen(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "What is 2+3 and 4*5?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "2+3"}},
                },
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "4*5"}'},
                },
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "20"},
        {"role": "assistant", "content": [{"type": "text", "text": "5 and 20."}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3 and 4*5?<|im_end|>\n"
        "<|im_start|>assistant\nLet me compute.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4*5"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n20\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n5 and 20.<|im_end|>\n"
    )
    with_tools = tokenizer.apply_chat_template(
        messages[:1], tools=[calc.CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert with_tools.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert "<tools>\n" + json.dumps(calc.CALCULATOR_TOOL) + "\n</tools>" in with_tools
    assert with_tools.endswith(
        "<|im_start|>user\nWhat is 2+3 and 4*5?<|im_end|>\n<|im_start|>assistant\n"
    )


# ------------------------------------------------------------------- model


def test_model_shape_and_init_are_fixed(base_path: Path, tokenizer) -> None:
    model = load_model(base_path)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert 1_500_000 < count_parameters(model) < 2_500_000
    again = build_model(ModelRecipe(), tokenizer)
    theirs = again.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    ids = torch.tensor([render(tokenizer, [{"role": "user", "content": "1 + 2"}])])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
    assert load_model(base_path, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_generate_stops_at_im_end(base_path: Path, tokenizer) -> None:
    model = load_model(base_path)
    prompt = torch.tensor(
        [render(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)]
    )
    out = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= prompt.shape[1] + 5
    assert model.generation_config.eos_token_id == stop_token_ids(tokenizer)
    assert not math.isnan(float(out.float().mean()))


# ----------------------------------------------------------------- warm-up

TINY = WarmupRecipe(
    max_steps=6,
    min_steps=3,
    cooldown_steps=3,
    warmup_steps=2,
    batch_size=4,
    eval_every=3,
    probe_size=4,
    lr=3e-3,
)


def test_transcript_mask_covers_exactly_the_assistant_turns(tokenizer) -> None:
    problem = calc.make_problems(1, "train", seed=3)[0]
    messages = calc.transcript(problem, "clean", _rng())
    ids, mask = encode_transcript(tokenizer, messages)
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    call = '<tool_call>\n{"name": "calculator", "arguments": '
    call += calc.tool_arguments_json(problem.expression) + "}\n</tool_call><|im_end|>"
    assert trained == call + f"The answer is {problem.answer}.<|im_end|>"


def test_tiny_warmup_runs_learns_and_is_deterministic(cache: Path, base_path: Path) -> None:
    recipe = Recipe(warmup=TINY)
    warm = build_starter(cache_dir=cache, warm=True, recipe=recipe)
    info = starter.read_info(warm)
    stats = info["warmup_stats"]
    assert info["warm"] is True and stats["steps"] == TINY.max_steps
    first, last = stats["losses_first_last"]
    assert math.isfinite(last) and last < first
    assert {"copy_acc", "token_acc", "loss"} <= set(stats["history"][0])
    # the same recipe, built again elsewhere under another ambient thread count, gives
    # the same weights (the warm-up pins its own threads, and restores the caller's)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if TINY.threads != 1 else 2)
    try:
        again = build_starter(cache_dir=cache / "again", warm=True, recipe=recipe)
        assert torch.get_num_threads() == (1 if TINY.threads != 1 else 2)
    finally:
        torch.set_num_threads(threads)
    ours, theirs = load_model(warm).state_dict(), load_model(again).state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert info["weights_sha256"] == starter.read_info(again)["weights_sha256"]
    changed = load_model(base_path).state_dict()
    assert not all(torch.equal(ours[k], changed[k]) for k in ours)


def test_warmup_mix_depends_on_the_problem_kind() -> None:
    """Guess kinds get ``guess_mix`` (mostly answered without the tool), others ``mix``."""
    recipe = WarmupRecipe()
    counts: dict[bool, dict[str, int]] = {True: {}, False: {}}
    stream = plan(recipe, "train", random.Random(0))
    for _ in range(4000):
        problem, kind = next(stream)
        row = counts[problem.kind in recipe.guess_kinds]
        row[kind] = row.get(kind, 0) + 1
    for guess, mix in ((True, recipe.guess_mix), (False, recipe.mix)):
        total = sum(counts[guess].values())
        assert total > 1000
        for kind, weight in mix:
            assert abs(counts[guess].get(kind, 0) / total - weight) < 0.04, (guess, kind)
        assert set(counts[guess]) == {k for k, _ in mix}


def test_warm_cache_key_names_torch_and_cpu() -> None:
    key = Recipe().key(warm=True)
    assert key["torch"] == torch.__version__
    assert key["cpu"] == torch.backends.cpu.get_cpu_capability()
    assert "torch" not in Recipe().key(warm=False)  # the untrained build is exact anywhere


def test_warm_cache_key_names_the_cpu_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPUs that torch both calls AVX512 (an Intel and an AMD EPYC) run other MKL
    kernels and warm up to other weights: they must not share a warm cache key."""
    from tether.starter import _build

    here = Recipe().digest(warm=True)
    assert Recipe().key(warm=True)["cpu_model"] == _build.cpu_model() != ""
    base = Recipe().digest(warm=False)
    monkeypatch.setattr(_build, "cpu_model", lambda: "GenuineIntel Intel(R) Xeon(R) Platinum")
    assert Recipe().digest(warm=True) != here
    assert Recipe().digest(warm=False) == base  # the untrained build is the same anywhere


def test_agent_loop_runs_on_the_untrained_model(base_path: Path, tokenizer) -> None:
    model = load_model(base_path)
    tasks = calc.make_tasks(2, "val")
    episodes = run_episodes(model, tokenizer, tasks, temperature=1.0, max_new_tokens=8)
    assert all(ep.done and 1 <= ep.calls <= 4 for ep in episodes)
    assert all(ep.reward in (0.0, 1.0) for ep in episodes)


def test_parse_tool_calls() -> None:
    text = (
        'ok\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "ok"
    assert calls == [{"name": "calculator", "arguments": {"expression": "1+2"}}]
    content, calls = parse_tool_calls("<tool_call>{oops</tool_call>")
    assert calls[0]["name"] is None and "bad tool call" in calls[0]["error"]
    assert parse_tool_calls("The answer is 3.") == ("The answer is 3.", [])


def test_staging_folders_of_killed_builds_are_removed(starter_dir: Path) -> None:
    import os
    import time

    root = starter_dir.parent
    dead = root / f".{starter_dir.name}.tmp-999999999-abc"  # no such process
    live = root / f".{starter_dir.name}.tmp-{os.getpid()}-abc"  # a build still running
    old = root / f".{starter_dir.name}.tmp-oldstyle"  # no pid, two hours old
    young = root / f".{starter_dir.name}.tmp-newstyle"  # no pid, just made
    for d in (dead, live, old, young):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    try:
        assert build_starter(cache_dir=root) == starter_dir  # cached: nothing rebuilt
        assert not dead.exists() and not old.exists()
        assert live.is_dir() and young.is_dir()
    finally:
        for d in (dead, live, old, young):
            shutil.rmtree(d, ignore_errors=True)
