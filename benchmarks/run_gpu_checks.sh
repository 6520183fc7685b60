#!/usr/bin/env bash
# The GPU checks in one command (issue 23), run from a copy of the repository on a machine
# whose python3 has CUDA torch. It installs nothing from the network: wheels the machine
# lacks travel in .whl/ (`make gpu-wheels` downloads them here), go into /tmp/areal-site, and
# come first on PYTHONPATH. Results (logs and JSON, at most 8 files) land in OUT_DIR.
#
#   benchmarks/run_gpu_checks.sh OUT_DIR [tests,bench,rl,megatron-run,rl-longtail]   # default: tests,bench,rl
#
# Each part has its own time limit, so one that hangs cannot take the others' results with it.
# Parts: tests, bench, rl, megatron-run, rl-longtail, probe (async vs sync with a random 0.5B-shaped model,
# the simulator's prediction beside the measurement: benchmarks/bench_gpu_probe.py).
set -u -o pipefail
OUT=${1:-benchmarks/results/gpu}
PARTS=${2:-tests,bench,rl}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 AREAL_GRAPH_CACHE=${AREAL_GRAPH_CACHE:-/tmp/areal-kits}
# cpu: a dry run of the plumbing on a machine without a GPU (the gpu tests skip there)
TEST_DEVICE=${AREAL_TEST_DEVICE:-cuda}

if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/areal-site \
    "$ROOT"/.whl/*.whl || exit 1
  export PYTHONPATH=/tmp/areal-site${PYTHONPATH:+:$PYTHONPATH}
fi
# the repository root is the package `areal_graph`
mkdir -p /tmp/areal-pkg && ln -sfn "$ROOT" /tmp/areal-pkg/areal_graph
export PYTHONPATH=/tmp/areal-pkg${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"transformers", transformers.__version__, "gpu", torch.cuda.get_device_name())'
  nproc; free -g | head -2; df -hT . /tmp | tail -2; } 2>&1 | tee "$OUT/machine.txt"

status=0
LOG="$OUT/run.log"  # every part's output, in order (the device tool brings back 8 files at most)
has() { case ",$PARTS," in *",$1,"*) return 0;; *) return 1;; esac; }
part() { echo "=== $1 ($(date +%T))" | tee -a "$LOG"; }

if has tests; then
  # the CPU suites that take a device (AREAL_TEST_DEVICE), then every test marked gpu
  part "tests on $TEST_DEVICE"
  AREAL_TEST_DEVICE=$TEST_DEVICE timeout 150 $PY -m pytest -q -p no:cacheprovider \
    tests/engines/inference/test_engine.py tests/engines/inference/test_interruptible.py \
    tests/engines/inference/server/test_http_server.py 2>&1 | tee -a "$LOG" | tail -3 || status=1
  part "tests marked gpu"
  # only the modules that hold gpu tests: the others import what that machine may lack (openai)
  timeout 200 $PY -m pytest -q -s -p no:cacheprovider -m gpu $(grep -rl "mark.gpu" tests --include="test_*.py") \
    2>&1 | tee -a "$LOG" | grep -v "^[0-9.]*s " | tail -30 || status=1
fi
if has bench; then
  part "bench_gpu"
  timeout 260 $PY benchmarks/bench_gpu.py --out "$OUT" 2>&1 | tee -a "$LOG" | grep -v "^ \|^{\|^}" | tail -60 || status=1
fi
if has rl; then  # one GPU time-shared: the engine and the trainer both on cuda:0
  part "rl short"
  timeout 300 $PY benchmarks/bench_async_vs_sync.py --steps 100 --eval-size 200 \
    --set models.actor.device=cuda --set inference.args.device=cuda --out "$OUT/rl_short.json" \
    2>&1 | tee -a "$LOG" | tail -12 || status=1
fi
if has megatron-run; then  # the Megatron-Core backend behind the same train/logprob nodes, a short run
  part "megatron run"
  rm -rf /tmp/areal-megatron-run  # a run directory that already holds a run is refused
  timeout 150 $PY -m areal_graph.cli.main run workflows/ppo_async.yaml runtime.steps=20 runtime.eval_every=20 \
    data.eval_size=200 runtime.save_every=0 models.actor.backend=megatron models.actor.device=cuda \
    inference.args.device=cuda --run-dir /tmp/areal-megatron-run 2>&1 | tee -a "$LOG" | tail -8 || status=1
  cp /tmp/areal-megatron-run/metrics.jsonl "$OUT/megatron_metrics.jsonl" 2>/dev/null
fi
if has rl-longtail; then
  part "rl long-tailed"
  timeout 400 $PY benchmarks/bench_async_vs_sync.py --steps 100 --eval-size 200 \
    --workflow workflows/ppo_async_longtail.yaml \
    --set models.actor.device=cuda --set inference.args.device=cuda --out "$OUT/rl_longtail.json" \
    2>&1 | tee -a "$LOG" | tail -12 || status=1
fi
if has probe; then
  part "probe: async vs sync, 0.5B shape, predicted and measured"
  timeout 560 $PY benchmarks/bench_gpu_probe.py --out "$OUT" --device "$TEST_DEVICE" \
    $( [ "$TEST_DEVICE" = cpu ] && echo "--small --cal-steps 10 --steps 12 --max-new-tokens 64 --timeout 120" ) \
    2>&1 | tee -a "$LOG" | tail -6 || status=1
fi
part "done, status $status"
exit $status
