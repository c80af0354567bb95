#!/usr/bin/env bash
# Makes (or reuses) the venv the Python client tests run in, with
# confluent-kafka, pyarrow and wandb from PyPI. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HINTSTREAM_PYTHON_VENV:-target/python-venv}
if ! "$venv/bin/python" -c "import confluent_kafka, pyarrow, wandb" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check -r examples/python/requirements.txt >&2
fi
echo "$venv/bin/python"
