#!/usr/bin/env bash
# Stage 2's whole step path on Apache Kafka: JSON rows against Arrow input,
# from the last input message acknowledged to the step's advantages and
# metrics consumed, with a broker-only baseline (examples/step_path.rs says
# what is timed). Installs the broker's jars when missing
# (scripts/kafka.sh), starts a node on a free port, builds the
# release binaries, runs the example, stops the broker on exit, and writes a
# report (machine, command, tables) to --out and stdout.
#
#   scripts/bench-step-path.sh [--out FILE] [--note TEXT] [EXAMPLE ARGS...]
#
#   --out FILE    report file [default: target/bench/step-path.md]
#   --note TEXT   a line about the machine for the report (shared, other load)
#   --hintstream PATH  run this worker binary, and the example as built (built
#                 only when missing), instead of building both
#   --perf DIR    record every worker with `perf record -e cpu-clock -g` into
#                 DIR/hintstream-PID.data (give a binary with its symbols kept:
#                 `cargo rustc --release --bin hintstream -- -C strip=none`;
#                 PERF_FREQ sets the sampling rate, 499 Hz by default)
#   --broker-cpus LIST  pin the broker's JVM, every thread, to these CPUs
#                 (taskset's list: 0, 0-3, 0,2)
#   --side-cpus LIST    run the example, and so the trainer's side, the echo
#                 and the worker, on these CPUs
#   EXAMPLE ARGS  passed to the example, e.g. --rows 16000,64000 --repeats 3
#                 --formats json,arrow --json-max-rows 64000 --no-baseline
set -euo pipefail
cd "$(dirname "$0")/.."

out="${CARGO_TARGET_DIR:-target}/bench/step-path.md"
note=""
binary=""
perf_dir=""
broker_cpus=""
side_cpus=""
example_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --note) note=$2; shift 2 ;;
    --hintstream) binary=$2; shift 2 ;;
    --perf) perf_dir=$2; shift 2 ;;
    --broker-cpus) broker_cpus=$2; shift 2 ;;
    --side-cpus) side_cpus=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) example_args+=("$1"); shift ;;
  esac
done

free_port() {
  local port
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 30000))
    # The node's controller listens on the next port.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
      && ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "bench-step-path: no free port found" >&2
  return 1
}

if [ -n "$broker_cpus$side_cpus" ] && ! command -v taskset >/dev/null; then
  echo "bench-step-path: --broker-cpus and --side-cpus need taskset (util-linux)" >&2
  exit 2
fi
scripts/kafka.sh install
target="${CARGO_TARGET_DIR:-target}"
if [ -z "$binary" ] || [ ! -x "$target/release/examples/step_path" ]; then
  echo "bench-step-path: building release binaries" >&2
  cargo build --release --bin hintstream --example step_path
fi
binary=${binary:-$target/release/hintstream}

port=$(free_port)
tables=$(mktemp)
wrapper=$(mktemp)
trap 'rm -f "$tables" "$wrapper"; scripts/kafka.sh stop "$port"' EXIT
if [ -n "$perf_dir" ]; then
  mkdir -p "$perf_dir"
  perf_dir=$(cd "$perf_dir" && pwd)
  # perf stops its worker with SIGTERM when the example stops perf.
  printf '#!/bin/sh\nexec perf record -e cpu-clock -F ${PERF_FREQ:-499} -g -o "%s/hintstream-$$.data" -- "%s" "$@"\n' \
    "$perf_dir" "$(realpath "$binary")" >"$wrapper"
  chmod +x "$wrapper"
  binary=$wrapper
fi
scripts/kafka.sh start "$port" >/dev/null
if [ -n "$broker_cpus" ]; then
  scripts/kafka.sh pin "$port" "$broker_cpus"
fi

mkdir -p "$(dirname "$out")"
command=(${side_cpus:+taskset -c "$side_cpus"} "$target/release/examples/step_path" --bootstrap "127.0.0.1:$port" --hintstream "$binary" ${example_args[@]+"${example_args[@]}"})
started=$(date +%s)
"${command[@]}" >"$tables"
took=$(( $(date +%s) - started ))

gpu="none"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo none)
fi
{
  echo "# Stage 2 step path on Apache Kafka: JSON rows vs Arrow input"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo ' (with local changes)')"
  echo "- machine: $(nproc) vCPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GB RAM, GPU: $gpu${note:+; $note}"
  echo "- broker: Apache Kafka $(sed -n 's/^KAFKA_VERSION=//p' scripts/kafka.sh) (scripts/kafka.sh, one KRaft node), 127.0.0.1; topics of 1 partition"
  echo "- CPUs: the broker on ${broker_cpus:-any}, the example and the worker on ${side_cpus:-any}"
  echo "- command: \`scripts/bench-step-path.sh ${broker_cpus:+--broker-cpus $broker_cpus }${side_cpus:+--side-cpus $side_cpus }${example_args[*]-}\` ($took s)"
  echo
  cat "$tables"
} >"$out"
cat "$out"
echo "bench-step-path: report in $out" >&2
