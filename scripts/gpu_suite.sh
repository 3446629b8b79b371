#!/usr/bin/env bash
# The benchmarks that need a GPU, in one go: each at its published size with random weights, one
# JSON report per benchmark under OUT_DIR, each under its own time limit so that the whole suite
# ends within 9 minutes on one GPU.
#
#   scripts/gpu_suite.sh OUT_DIR            # run every benchmark (a CUDA device is required)
#   scripts/gpu_suite.sh --dry-run OUT_DIR  # print each command and check that each script starts
#                                           # (its --help), without running anything: works on a CPU
#   scripts/gpu_suite.sh --help             # this text
#
# Benchmarks (name: script, what it measures, its limit in seconds):
#   logprob        bench_logprob.py: the fused log-prob table (hidden 896 and 3,584, 4k and 16k
#                  tokens, the 151,936-token vocabulary, fp32) and a whole step against TRL's
#                  GRPOTrainer (80)
#   logprob_frozen bench_logprob.py --frozen-head: the same table with the projection frozen (50)
#   engine_memory  bench_engine.py --memory: peak allocated memory of one step of mmrl, TRL and the
#                  bare loop at the 151,936-token vocabulary and 512-token completions (90)
#   wan_1_3b       gpu_dry_run.py on t2v_wan.yaml at Wan2.1-T2V-1.3B's size, bf16, 4 videos of
#                  240 x 416 x 33 frames, the published overrides but 10 denoising steps and 2
#                  training steps, so that it fits the suite's 9 minutes (180)
#   rollout_vllm   bench_rollout.py --device cuda: HF generate against vLLM rollouts (90; skipped
#                  when vllm is not importable)
#   dlm            bench_dlm.py: the masked-diffusion and DiffusionGemma-shaped generation races (50)
# What it does not run yet (no random build of that size exists in scripts/): a Qwen2.5-7B-shaped
# VLM step, a Wan 14B-shaped video step across processes, SD3.5 / FLUX-shaped image steps.
#
# Environment: PYTHON (default: python), SUITE_SCALE (multiplies every limit; default 1).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

dry_run=0
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --dry-run) dry_run=1; shift ;;
esac
if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu_suite.sh [--dry-run] OUT_DIR (--help for more)" >&2
  exit 2
fi
out_dir=$1
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python}
scale=${SUITE_SCALE:-1}

benchmarks=(
  "logprob|80|bench_logprob.py|"
  "logprob_frozen|50|bench_logprob.py|--frozen-head --no-step"
  "engine_memory|90|bench_engine.py|--vocab 151936 --completion-tokens 512 --memory --rounds 0 --no-rss --bare-micro-batch 1 --hidden 64 --layers 2 --warmup 1"
  "wan_1_3b|180|gpu_dry_run.py|$here/../tasks/recipes/t2v_wan.yaml --random wan2.1-t2v-1.3b --steps 2 policy.dtype=bfloat16 policy.height=240 policy.width=416 policy.num_frames=33 policy.num_steps=10 policy.eval_num_steps=10 policy.guidance_scale=5.0 policy.gradient_checkpointing=true policy.vae_tiling=true policy.decode_batch=1 algorithm.group_size=4 optim.prompts_per_step=1 optim.micro_batch_size=1"
  "rollout_vllm|90|bench_rollout.py|--device cuda --hidden 1024 --layers 8 --heads 16"
  "dlm|50|bench_dlm.py|--reps 3"
)

if [ "$dry_run" = 0 ]; then
  "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "gpu_suite: no CUDA device (use --dry-run to check the suite on a CPU)" >&2
    exit 3
  }
  mkdir -p "$out_dir"
fi

failed=0
for entry in "${benchmarks[@]}"; do
  IFS='|' read -r name limit script args <<<"$entry"
  limit=$(awk -v l="$limit" -v s="$scale" 'BEGIN { printf "%d", l * s }')
  # shellcheck disable=SC2086  # the arguments are split on purpose
  command=("$python" "$here/$script" $args --json "$out_dir/$name.json")
  if [ "$dry_run" = 1 ]; then
    echo "$name (limit ${limit}s): timeout $limit ${command[*]}"
    "$python" "$here/$script" --help >/dev/null || { echo "gpu_suite: $script does not start" >&2; failed=1; }
    continue
  fi
  if [ "$name" = rollout_vllm ] && ! "$python" -c 'import vllm' 2>/dev/null; then
    echo "{\"skipped\": \"vllm is not importable by $python\"}" >"$out_dir/$name.json"
    continue
  fi
  echo "gpu_suite: $name (limit ${limit}s)" >&2
  if ! timeout "$limit" "${command[@]}" >"$out_dir/$name.log" 2>&1; then
    echo "gpu_suite: $name failed or ran past ${limit}s (see $out_dir/$name.log)" >&2
    failed=1
  fi
done
exit "$failed"
