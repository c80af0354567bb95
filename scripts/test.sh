#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), then runs
# every test, after checking that the CUDA build compiles. Integration tests
# start Apache Kafka nodes on free ports from the jars that `scripts/kafka.sh
# install` resolves with Maven (once; cached outside the tree), and librdkafka
# mock clusters where they inject broker errors; set HINTSTREAM_TEST_BOOTSTRAP
# to use a running broker instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A cold build of everything below takes ~4.5 GB under target/ (docs/BENCHMARKS.md,
# "Cold start"); say so before the linker fails with "No space left on device".
free_kb=$(df -Pk "${CARGO_TARGET_DIR:-.}" 2>/dev/null | awk 'NR == 2 {print $4}' || true)
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
  echo "warning: only $((free_kb / 1024)) MiB free here; a cold build needs ~4.5 GB under target/ (free space, or set CARGO_TARGET_DIR to a larger disk)" >&2
fi
scripts/kafka.sh install
# The real llama.cpp server of tests/it/hints/local_model.rs: ~8 min cold on 2 busy
# cores (the wheel's build), ~20 s from the cached wheel, instant once installed.
scripts/local-llm.sh install
# The TRL smoke run's venv (tests/it/trainer/trl_smoke.rs): torch with its CUDA 13 runtime
# wheels, transformers, TRL, the policy's GGUF; ~2.8 GB downloaded and ~8 min on 2 busy cores
# cold, cached in ~/.cache/hintstream/rl, under a second warm (docs/BENCHMARKS.md, "A real
# run"). Mostly download and unpacking: it runs beside the builds below, and the tests wait for it.
scripts/rl-venv.sh >/dev/null &
rl_venv=$!
# The book (docs/, mdBook from crates.io: 5.6 CPU-minutes cold, ~14 min on 2 busy cores; then
# cached in ~/.cache/hintstream) must build; its links, the README's length
# and the generated configuration reference are checked by the tests
# (contract::book).
scripts/mdbook.sh build >/dev/null
# The CUDA path must compile on machines without CUDA (dynamic loading).
cargo build --locked --features cuda
# Benches and examples must build; they are run by their own scripts.
cargo build --locked --all-targets
cargo check --manifest-path fuzz/Cargo.toml  # the fuzz targets build (on stable; scripts/fuzz.sh runs them)
# The Helm chart: helm v3.22.0 built from its Go module (cached), lint, render
# under deploy/helm/hintstream/ci/*-values.yaml, and the rendered manifests
# decoded strictly against their Go types (deploy/helm/check); the binary
# built above loads each rendered hintstream.toml. ~8 min cold on 2 cores
# (docs/BENCHMARKS.md, "Cold start"), seconds once cached.
scripts/helm.sh check
wait "$rl_venv" || { echo "scripts/rl-venv.sh failed (the TRL smoke run's venv)" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --locked --no-fail-fast --lib --bins --tests "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s += $1} END {print s + 0}')
echo "tests: $passed passed, $failed failed"
exit "$status"
