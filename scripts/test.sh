#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), then runs
# every test, after checking that the CUDA build compiles. Integration tests start their own tansu broker on a free port
# and librdkafka mock clusters; set HINTSTREAM_TEST_BOOTSTRAP to use a running
# broker instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The CUDA path must compile on machines without CUDA (dynamic loading).
cargo build --locked --features cuda
cargo test --all-targets --locked "$@"
