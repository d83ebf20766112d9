#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one command of under 10 minutes (make gpu-check): the
# figures of docs/performance.md's GPU tables and the gpu test tier, most needed first, each part
# with its own time limit inside one budget (GPU_CHECK_SECONDS, default 570), so that a slow part
# costs the parts after it, never the whole run. What is left when a part's turn comes bounds it;
# under 30 s left, the part is skipped and the log says so.
#
#   1. one training step of configs/cifar10_hybrid.yaml: improved-diffusion's --use_fp16 step,
#      raydiff eager fp16/bf16, compiled bf16 (its first step compiles cold), channels-last
#      (bench/gpu_step.py), and the step's noise draw both ways
#   2. the gpu test tier (pytest -m gpu): compiled and eager losses on CUDA, Ray Train on a GPU,
#      sampling on a GPU actor, the keyed noise on CUDA
#   3. DDIM-50 and 250-step ancestral sampling against improved-diffusion's loops
#      (bench/sampling.py --gpu)
#   4. the compiled step again in a new process on the same inductor cache (a restart's warm
#      first step), and in CUDA graphs (mode="reduce-overhead", on the graph just cached)
#   5. configs/imagenet64_cond.yaml's step: improved-diffusion, raydiff bf16 eager and compiled
#   6. the preemption check in a GPU worker of Ray Train (bench/preemption_check.py)
#
# Writes gpu_check.log and each benchmark's JSON into $OUT (default bench/results/gpu_check).
# Where Ray and raydiff's other requirements are not installed, .gpu/site.tar.xz
# (scripts/gpu_bundle.sh) is unpacked onto PYTHONPATH first. improved-diffusion's checkout is
# read from .reference/improved-diffusion (docs/testing.md#on-a-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu_check}"
mkdir -p "$out"
log="$out/gpu_check.log"
budget="${GPU_CHECK_SECONDS:-570}"
start=$SECONDS
py="${PYTHON:-python3}"
site=/tmp/raydiff-site
if ! "$py" -c "import ray" 2>/dev/null && [ -f .gpu/site.tar.xz ]; then
  mkdir -p "$site" && tar -xJf .gpu/site.tar.xz -C "$site"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"  # a throwaway single-machine Ray
cache="$(mktemp -d)/inductor"
step_args=(--reference-root .reference --cache-dir "$cache")

part() {  # NAME SECONDS COMMAND...
  local name=$1 limit=$2 left began
  shift 2
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped, ${left} s of the budget left" | tee -a "$log"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit} s): $*" | tee -a "$log"
  began=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - began)) s" | tee -a "$log"
}

part environment 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader; $py -c 'import torch, ray, raydiff; print(\"torch\", torch.__version__, \
  \"CUDA\", torch.version.cuda, \"ray\", ray.__version__, \"raydiff\", raydiff.__file__)'"
if ! "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "bench/gpu_check.sh: torch sees no CUDA GPU here; run it on a GPU machine" | tee -a "$log"
  exit 2
fi
part "training step, cifar10_hybrid" 170 "$py" bench/gpu_step.py "${step_args[@]}" \
  --presets cifar10_hybrid --steps 10 --warmup 3 \
  --modes ref-fp16,raydiff-fp16,raydiff-bf16,raydiff-bf16-compile,raydiff-bf16-channels-last \
  --out "$out/gpu_step_cifar10.json"
part "gpu test tier" 220 "$py" -m pytest -m gpu tests/gpu -q -p no:cacheprovider
part "sampling against improved-diffusion" 110 "$py" bench/sampling.py --gpu \
  --reference-root .reference --cache-dir "$cache" --ddim-batches 2 --ancestral-batches 1 \
  --modes ref-fp32,ref-fp16,raydiff-fp32,raydiff-bf16,raydiff-bf16-compile \
  --out "$out/sampling_gpu.json"
part "a restart's first compiled step (warm cache), and CUDA graphs" 70 "$py" \
  bench/gpu_step.py "${step_args[@]}" --no-reference --presets cifar10_hybrid \
  --modes raydiff-bf16-compile,raydiff-bf16-cudagraphs --steps 5 --warmup 2 \
  --out "$out/gpu_step_warm.json"
part "training step, imagenet64_cond" 90 "$py" bench/gpu_step.py "${step_args[@]}" \
  --presets imagenet64_cond --steps 5 --warmup 2 \
  --modes ref-fp16,raydiff-bf16,raydiff-bf16-compile --out "$out/gpu_step_imagenet64.json"
part "preemption check in a GPU worker" 40 "$py" bench/preemption_check.py --use-gpu \
  --workers 1 --calls 100 --warmup 10
echo "== done in $((SECONDS - start)) s" | tee -a "$log"
