#!/usr/bin/env bash
# Reports the GPU (name, architecture as compute capability, driver version),
# then compares the CUDA advantage kernel with the CPU kernel for every
# estimator under both hint baselines (reference, raw), grpo without
# norm_by_std, and reinforce_pp with random response lengths and a custom
# whiten_epsilon, on fresh random inputs (max relative error < 1e-9, std-0
# groups exact), times both and prints a table. One call on a GPU machine.
#
#   scripts/gpu-check.sh [ROWS...]            build with --features cuda, then run
#   scripts/gpu-check.sh --no-build [ROWS...] run a binary built earlier (carried
#                                             to a GPU machine without a Rust
#                                             toolchain; GPU_CHECK_BIN=path)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GPU_CHECK_BIN:-target/release/examples/gpu_check}
if [ "${1:-}" = "--no-build" ]; then
  shift
else
  cargo build --release --features cuda --example gpu_check
fi
if command -v nvidia-smi >/dev/null; then
  # compute_cap needs a driver from 2022 or later; fall back without it.
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>/dev/null ||
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi | sed -n 's/.*\(Driver Version: [0-9.]*\).*\(CUDA Version: [0-9.]*\).*/\1 | \2/p'
else
  echo "nvidia-smi: not available"
fi
exec "$bin" "$@"
