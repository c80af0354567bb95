#!/usr/bin/env bash
# What a trainer waits for at each step, from Python: publish_scored of a
# step's rows, then wait_advantages, with the rows sent as JSON (a message a
# row) and as Arrow (arrow=True), alternated on one Apache Kafka node and one
# release `hintstream advantages` (python/tests/bench_trainer_step.py says
# what is timed and checked). Makes the venv (scripts/python-venv.sh), builds
# the release binary and installs the broker's jars (scripts/kafka.sh) first.
# With --vs-client DIR (another build of the package: a directory holding
# hintstream/, such as a worktree's python/src) that client runs beside this
# one on the same broker and worker, the same rows each round.
#
#   scripts/bench-trainer-step.sh [--rows 10000] [--rounds 10] [--vs-client DIR] [--out FILE.md]
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/python-venv.sh)
cargo build --quiet --release --bin hintstream
scripts/kafka.sh install
export CARGO_BIN_EXE_hintstream="${CARGO_TARGET_DIR:-$PWD/target}/release/hintstream"
exec "$python" python/tests/bench_trainer_step.py "$@"
