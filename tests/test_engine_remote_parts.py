"""The remote engine's parts that need no server: replicas, weight folders, the broadcast
group, the config (``tether/engine/_replicas.py``, ``_weight_transports.py``, ``_config.py``)."""

from __future__ import annotations

import datetime
import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tether.engine import EngineConfig, EngineFailed
from tether.engine._replicas import ReplicaSet
from tether.engine._weight_transports import (
    BroadcastGroup,
    prune,
    save_adapter,
    save_full,
    tensor_metas,
)
from tether.errors import UserError

URLS = ["http://a:8000", "http://b:8000", "http://c:8000/"]


def test_a_rollout_sticks_to_one_replica_and_rollouts_spread() -> None:
    replicas = ReplicaSet(URLS)
    picks = {f"r-{i}": replicas.pick(f"r-{i}").url for i in range(300)}
    assert all(replicas.pick(k).url == url for k, url in picks.items())  # sticky
    counts = Counter(picks.values())
    assert set(counts) == {"http://a:8000", "http://b:8000", "http://c:8000"}
    assert min(counts.values()) > 60  # roughly even: 100 each expected


def test_a_down_replica_moves_only_its_rollouts() -> None:
    replicas = ReplicaSet(URLS)
    before = {f"r-{i}": replicas.pick(f"r-{i}").url for i in range(200)}
    b = replicas.replicas[1]
    replicas.mark_down(b, "connection refused")
    after = {k: replicas.pick(k).url for k in before}
    assert "http://b:8000" not in after.values()
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k, url in before.items() if url == "http://b:8000"}
    replicas.mark_up(b)
    assert {k: replicas.pick(k).url for k in before} == before


def test_no_replica_up_is_one_error_naming_them() -> None:
    replicas = ReplicaSet(URLS[:2])
    for r in replicas:
        replicas.mark_down(r, "gone")
    with pytest.raises(EngineFailed, match=r"no inference server is up \(http://a:8000, http://b"):
        replicas.pick("r-1")


def test_without_affinity_the_least_busy_replica_serves() -> None:
    replicas = ReplicaSet(URLS)
    replicas.replicas[0].in_flight = 3
    replicas.replicas[1].in_flight = 1
    replicas.replicas[2].in_flight = 2
    assert replicas.pick(None).url == "http://b:8000"


def test_a_url_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        ReplicaSet(["http://a:1", "http://a:1/"])


def test_full_weights_folder_loads_with_from_pretrained(starter_dir: Path, tmp_path: Path) -> None:
    from tether.models import load_model

    model = load_model(starter_dir)
    state = {k: v + 0.01 for k, v in model.state_dict().items()}
    folder = save_full(state, tmp_path / "v1", starter_dir)
    assert (folder / "config.json").is_file() and not (tmp_path / "v1.tmp").exists()
    loaded = load_model(folder).state_dict()
    for name, t in state.items():
        assert torch.equal(loaded[name], t), name


def test_tied_weights_are_written_once_each_name(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    shared = torch.randn(4, 3)
    folder = save_full({"embed.weight": shared, "lm_head.weight": shared}, tmp_path / "v2", None)
    back = load_file(str(folder / "model.safetensors"))
    assert torch.equal(back["embed.weight"], shared) and torch.equal(back["lm_head.weight"], shared)


def test_adapter_folder_loads_with_peft(starter_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model

    from tether._hf import adapter_config, adapter_weights
    from tether.models import load_model

    torch.manual_seed(0)
    peft_model = get_peft_model(
        load_model(starter_dir), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # B starts at zero: make the adapter do something
    folder = save_adapter(adapter_weights(peft_model), adapter_config(peft_model), tmp_path / "a")
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4
    loaded = PeftModel.from_pretrained(load_model(starter_dir), str(folder))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, peft_model(ids).logits)


def test_prune_keeps_the_newest_folders(tmp_path: Path) -> None:
    for n in (1, 2, 10, 3):
        (tmp_path / f"v{n}").mkdir()
    (tmp_path / "lora-v4").mkdir()
    prune(tmp_path, "v", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora-v4", "v10", "v3"]


def _peer(port: int, group_name: str, metas: list[Any], out: dict[str, torch.Tensor]) -> None:
    """Rank 1 of the broadcast group, as a server joins it."""
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timeout)
    pg = dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), 1, 2, timeout)
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    for m in metas:
        t = torch.empty(m.shape, dtype=getattr(torch, m.dtype))
        pg.broadcast([t], opts).wait()
        out[m.name] = t


def test_broadcast_group_sends_every_tensor_in_order() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = {"a": torch.randn(3, 2), "b": torch.arange(5, dtype=torch.int64), "c": torch.ones(1)}
    metas = tensor_metas(state)
    assert [(m.name, m.dtype, m.shape) for m in metas][:2] == [
        ("a", "float32", (3, 2)),
        ("b", "int64", (5,)),
    ]
    group = BroadcastGroup(
        "127.0.0.1", port, 2, backend="gloo", group_name="g1", prefix="g1/", timeout_s=30
    )
    got: dict[str, torch.Tensor] = {}
    peer = threading.Thread(target=_peer, args=(port, "g1/", metas, got))
    peer.start()
    group.join()
    group.broadcast(state)
    peer.join(30)
    assert set(got) == set(state)
    assert all(torch.equal(got[k], state[k]) for k in state)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kind": "vllm"}, "needs the servers' URLs: engine.urls="),
        ({"kind": "tgi", "urls": ["http://a:1"]}, "engine.kind ('tgi') must be one of"),
        ({"kind": "vllm", "urls": ["a:1"]}, "must start with http://"),
        ({"kind": "vllm", "urls": ["http://a:1"], "transport": "ftp"}, "engine.transport"),
        ({"kind": "vllm", "urls": ["http://a:1"], "keep_weights": 0}, "keep_weights"),
        ({"kind": "vllm", "urls": ["http://a:1"], "timeout_s": 0}, "engine.timeout_s"),
    ],
)
def test_engine_config_names_the_bad_value(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        EngineConfig(**kw)


def test_one_url_on_the_command_line_is_a_list() -> None:
    assert EngineConfig(kind="sglang", urls="http://a:30000").urls == ["http://a:30000"]  # type: ignore[arg-type]


def test_the_lora_transport_needs_a_lora_trainer() -> None:
    from tether.run.config import TrainConfig

    with pytest.raises(UserError, match=r"engine\.transport=lora pushes the LoRA adapter"):
        TrainConfig(engine=EngineConfig(kind="vllm", urls=["http://a:1"], transport="lora"))


def test_vllm_nccl_pushes_are_refused_until_the_trainer_can_join_its_group() -> None:
    from tether.engine import RemoteEngine, server_api

    with pytest.raises(EngineFailed, match="not supported for vLLM: tether's trainer cannot join"):
        RemoteEngine(server_api("vllm"), ["http://127.0.0.1:9"], transport="nccl")
