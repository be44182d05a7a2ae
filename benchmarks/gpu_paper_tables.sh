#!/usr/bin/env bash
# The pFedKDH paper's MNIST (Table 2) and CIFAR-10 (Table 3) sweeps at full Table 1 settings
# (20 clients, 50% participation, 50 rounds, 3 seeds, all methods of the sweep files) on one GPU.
# Ten clients share the GPU (client_gpus=0.1); models and each client's data stay on the GPU.
#
#   benchmarks/gpu_paper_tables.sh DATA_DIR [OUT]      # DATA_DIR holds mnist.npz and cifar10.npz
#
# Resumable (finished runs are skipped); ends with `fedpers report` tables and figures in OUT/*/.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=$(realpath "${1:?usage: benchmarks/gpu_paper_tables.sh DATA_DIR [OUT]}")
OUT=${2:-results/gpu_paper_tables}
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
FEDPERS=${FEDPERS:-.venv/bin/fedpers}
COMMON=(--set "data_dir=$DATA_DIR" --set device=cuda --set client_gpus=0.1 --set client_cpus=1)
"${PYTHON:-.venv/bin/python}" - <<'PY' || { echo "no CUDA device: this script is for a GPU machine" >&2; exit 1; }
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)
PY
"$FEDPERS" sweep configs/sweeps/pfedkdh_table2.yaml --datasets mnist --out "$OUT/table2_mnist" "${COMMON[@]}"
"$FEDPERS" sweep configs/sweeps/pfedkdh_table3_cifar10.yaml --out "$OUT/table3_cifar10" "${COMMON[@]}"
