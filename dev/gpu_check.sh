#!/usr/bin/env bash
# The GPU check: what tether does on one CUDA device, in one run of under 8 minutes.
#
#   dev/gpu_check.sh OUTDIR [--device cuda|cpu] [--fast] [--demo-model DIR]
#
# Writes one text file per figure to OUTDIR (and summary.txt, timings.txt):
#   pytest_gpu.txt       the CUDA-marked tests (pytest -m gpu)
#   real_servers.txt     tests/test_engine_remote.py against real vLLM / SGLang servers
#                        (TETHER_REAL_SERVERS=1; skipped with the reason where not importable)
#   engine_throughput.txt engine tokens/s, Qwen2.5-0.5B-shaped random model (bf16, SDPA),
#                        1/16/64 concurrent vs model.generate one at a time
#   train_memory.txt     one GRPO update's time and peak memory, full and LoRA
#                        (benchmarks/train_memory.py --quick; one LoRA row with --fast)
#   logprob_gap.txt      engine (fp32 / bf16 / int8 copies) vs trainer (fp32 / bf16) logprobs
#   fsdp2.txt            two sharded updates (trainer.strategy=fsdp2; bf16 on a GPU; 2
#                        processes with 2 GPUs, else 1), a checkpoint and its --resume
#   demo.txt             tether demo --device DEVICE: wall time and held-out gain
# --fast: tiny sizes (a random 0.18M-parameter model, 1 demo update on 2 held-out tasks);
# with --device cpu it is the default test suite's check that this script still runs
# (tests/test_gpu_check.py). --demo-model runs the demo from that folder instead of the
# warm starter (the tests use the untrained one: no warm-up build). DEMO_STEPS (default
# 40 on a device, 1 with --fast) sets the demo's updates. Exit status: 0 when every step
# ran; 1 when one failed (the others still run; see its file). See docs/gpu.md.
set -uo pipefail

usage() { echo "usage: dev/gpu_check.sh OUTDIR [--device cuda|cpu] [--fast] [--demo-model DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
DEVICE=cuda; FAST=0; DEMO_MODEL=
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=${2:?--device needs cuda or cpu}; shift 2 ;;
    --fast) FAST=1; shift ;;
    --demo-model) DEMO_MODEL=${2:?--demo-model needs a folder}; shift 2 ;;
    *) usage ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || command -v python3 )}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
: > "$OUT/timings.txt"
STATUS=0

step() {  # step NAME COMMAND...: COMMAND's output to OUT/NAME.txt, its seconds to timings.txt
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $*" >&2
  if "$@" > "$OUT/$name.txt" 2>&1; then
    echo "$name ok $((SECONDS - t0)) s" >> "$OUT/timings.txt"
  else
    echo "$name FAILED (exit $?) $((SECONDS - t0)) s" >> "$OUT/timings.txt"
    echo "   $name failed; see $OUT/$name.txt" >&2
    STATUS=1
  fi
}

gpu_tests() {  # only the files that hold CUDA-marked tests: collecting the suite is slow
  local files
  files=$(grep -l "mark.gpu" tests/test_*.py)
  "$PY" -m pytest -q -m gpu -p no:cacheprovider $files
  local rc=$?
  [ $rc -eq 5 ] && return 0 || return $rc  # 5: none collected
}

real_servers() {  # the remote-engine cases against real vLLM / SGLang, where importable
  TETHER_REAL_SERVERS=1 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_engine_remote.py \
    -m "slow or not slow" -k "not unreachable"
}

train_memory() {
  # --fast: one row (tests/test_train_memory_bench.py covers the script itself)
  "$PY" benchmarks/train_memory.py --device "$DEVICE" --quick \
    $([ $FAST = 1 ] && echo "--rows lora/chunked+ckpt")
}

fsdp2() {  # two sharded updates of the starter (trainer.strategy=fsdp2): bf16 on a GPU, over
  # 2 processes when there are 2 GPUs, else 1 (a group of one); one checkpoint, resumed once
  local n=1 model=${DEMO_MODEL:-starter}
  if [ "$DEVICE" = cuda ]; then
    [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ] && n=2
  fi
  local args=("$ROOT/examples/calc/config.yaml" "dir=$OUT/fsdp2" "model.path=$model"
    "model.device=$DEVICE" "trainer.strategy=fsdp2" "run.processes=$n" "tasks.train_size=8"
    "eval.enabled=false" "checkpoint.every=1" "rollout.batch_groups=2"
    "gateway.default_max_tokens=24")
  [ "$DEVICE" = cuda ] && args+=("model.train_dtype=bfloat16")
  echo "fsdp2: $n process(es) on $DEVICE"
  "$PY" -m tether.cli train "${args[@]}" trainer.steps=1 \
    && "$PY" -m tether.cli train "${args[@]}" trainer.steps=2 --resume
}

demo() {  # in OUT, so its runs/ folder lands there
  local args=(--device "$DEVICE" --steps "${DEMO_STEPS:-$([ $FAST = 1 ] && echo 1 || echo 40)}")
  [ $FAST = 1 ] && args+=(--eval-tasks 2)
  [ -n "$DEMO_MODEL" ] && args+=(--model "$DEMO_MODEL")
  (cd "$OUT" && "$PY" -m tether.cli demo "${args[@]}")
}

if [ $FAST = 1 ]; then
  SHAPE=(--model-shape tiny)
  ENGINE=(--concurrency 1 4 --max-tokens 8 --prompt-len 16 --baseline-requests 2 --rounds 1)
  GAP=(--requests 2 --max-tokens 4 --prompt-len 8)
  DTYPE=float32
else
  SHAPE=(--model-shape qwen2.5-0.5b)
  ENGINE=(--concurrency 1 16 64 --max-tokens 64 --prompt-len 128 --baseline-requests 4)
  GAP=(--requests 16 --max-tokens 32)
  DTYPE=bfloat16
fi

{
  echo "gpu_check $(date -u +%FT%TZ) device=$DEVICE fast=$FAST commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} > "$OUT/environment.txt" 2>&1

step pytest_gpu gpu_tests
step real_servers real_servers
step engine_throughput "$PY" benchmarks/engine_throughput.py --device "$DEVICE" "${SHAPE[@]}" --dtype "$DTYPE" "${ENGINE[@]}"
step train_memory train_memory
step logprob_gap "$PY" benchmarks/logprob_gap.py --device "$DEVICE" "${SHAPE[@]}" "${GAP[@]}"
step fsdp2 fsdp2
step demo demo

{
  cat "$OUT/environment.txt"
  echo
  cat "$OUT/timings.txt"
  echo
  grep -h "passed\|skipped\|failed" "$OUT/pytest_gpu.txt" | tail -1
  grep -h "passed\|skipped\|failed\|SKIPPED" "$OUT/real_servers.txt" | tail -3
  grep -h "TransformersEngine\|model.generate" "$OUT/engine_throughput.txt"
  head -20 "$OUT/train_memory.txt"
  cat "$OUT/logprob_gap.txt" | grep -v "^Loading"
  grep -h "^fsdp2:\|^step \|resumed from" "$OUT/fsdp2.txt"
  grep -h "held-out success:" "$OUT/demo.txt"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
exit $STATUS
