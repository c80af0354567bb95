#!/usr/bin/env bash
# Stage 2's computation against the reference's algorithms in pure Python and
# in numpy, in one run on the same 1M rows (8 per group, 10% hinted, shuffled
# string ids), for every estimator: checks that all three agree (max relative
# difference < 1e-9) and prints each Rust figure with its ratio to the Python
# loop and to numpy. Rust paths (examples/bench_compute.rs): from a
# dictionary-encoded Arrow batch, from its IPC bytes, from string ids, and
# the offline compute path; each on one thread and on all cores.
#
#   scripts/bench-python.sh [ROWS] [ESTIMATOR...]   (default 1000000, all four)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-1000000}
shift || true
estimators=${*:-grpo drgrpo rloo batch_whiten}
target=${CARGO_TARGET_DIR:-target}
work=$target/bench-python
venv=$work/venv
mkdir -p "$work"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/pip" install -q numpy
cargo build --release --example bench_compute
[ -f "$work/rows-$rows.jsonl" ] || "$venv/bin/python" scripts/bench_python.py generate "$work/rows-$rows.jsonl" "$rows"
"$target/release/examples/bench_compute" "$work/rows-$rows.jsonl" "$work/out.rust" 7 | tee "$work/times.txt"
# shellcheck disable=SC2086
"$venv/bin/python" scripts/bench_python.py time "$work/rows-$rows.jsonl" "$work/out" $estimators | tee -a "$work/times.txt"
echo
# shellcheck disable=SC2086
"$venv/bin/python" scripts/bench_python.py report "$work/times.txt" "$work/out" $estimators
