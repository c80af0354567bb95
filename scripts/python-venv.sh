#!/usr/bin/env bash
# Makes (or reuses) the venv the Python tests run in, with the package in
# python/ installed from source with its [wandb,test] extras (confluent-kafka,
# pyarrow, wandb and pytest from PyPI). An existing venv is reused as it is
# when the installed package is current: a hash of python/'s package files is
# kept in the venv, and only a change reinstalls. Prints the venv's python.
#
#   scripts/python-venv.sh          (HINTSTREAM_PYTHON_VENV=DIR to choose the venv; default target/python-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HINTSTREAM_PYTHON_VENV:-target/python-venv}
stamp="$venv/.hintstream-package-hash"
hash=$(find python/pyproject.toml python/README.md python/src -type f \
  ! -path '*__pycache__*' ! -path '*.egg-info*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ] || ! "$venv/bin/python" -c "import hintstream, confluent_kafka, pyarrow, wandb, pytest" 2>/dev/null; then
  rm -f "$stamp"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install "./python[wandb,test]" >&2
  # A local directory of an unchanged version: make sure it is this source.
  "${pip[@]}" install --force-reinstall --no-deps ./python >&2
  rm -rf python/build python/src/*.egg-info
  echo "$hash" >"$stamp"
fi
echo "$(cd "$venv" && pwd)/bin/python"
