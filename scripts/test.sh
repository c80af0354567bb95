#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), then runs
# every test. Integration tests start their own tansu broker on a free port
# and librdkafka mock clusters; set HINTSTREAM_TEST_BOOTSTRAP to use a running
# broker instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --all-targets --locked "$@"
