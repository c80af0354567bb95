#!/usr/bin/env bash
# Per-step time of the Python trainer loop before and after 30,000 old hints
# and 2,000 old advantage messages were put on the topics (Apache Kafka + both
# stages + a loopback LLM, all started here); prints a Markdown table and
# writes it to OUT (default /tmp/hs-notes/python-bench.md).
#
#   scripts/bench-trainer-client.sh [--steps N] [--out FILE.md]
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/python-venv.sh)
cargo build --quiet --bin hintstream
scripts/kafka.sh install
export CARGO_BIN_EXE_hintstream="${CARGO_TARGET_DIR:-$PWD/target}/debug/hintstream"
exec "$python" python/tests/bench_trainer_client.py "$@"
