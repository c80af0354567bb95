#!/usr/bin/env bash
# Stage 1's static-hint path (no model API) against a consume->produce
# passthrough in Python (confluent-kafka, batches of 1,000, no parsing) and
# the floor (examples/static_floor.rs: the worker's output bytes and headers
# under its guarantee, no hint work), side by side on one Apache Kafka node
# in one invocation (issue 34, P4): N small failed trajectories of
# group_size 1 on 6 partitions, each side timed from
# its start to N messages on its output topic (scripts/bench_static_hints.py
# says what is timed). Installs the broker's jars (scripts/kafka.sh) and the
# Python venv (scripts/python-venv.sh) when missing, builds the release
# binary, starts a node on a free port, stops it on exit, and writes a report
# to --out and stdout.
#
#   scripts/bench-static-hints.sh [--out FILE] [--note TEXT] [--perf FILE] [ARGS...]
#
#   --out FILE    report file [default: target/bench/static-hints.md]
#   --note TEXT   a line about the machine for the report
#   --perf FILE   record the first repeat's worker with `perf record -e cpu-clock -g`
#                 (the binary linked with its symbols kept)
#   --hintstream PATH  run this binary instead of building one (the floor,
#                 examples/static_floor.rs, is built in either case: cargo does
#                 nothing when it is up to date)
#   --broker-cpus LIST  pin the broker's JVM, every thread, to these CPUs
#                 (taskset's list: 0, 0-3, 0,2)
#   --side-cpus LIST    run the harness, and so each side (the passthrough, the
#                 worker, the floor), on these CPUs; with --broker-cpus on
#                 others, no side shares a core with the broker
#   --vs PATH     another build of hintstream, run the same way on the same input
#                 (its own group and output topic) as one more side, after the
#                 worker in odd-numbered repeats and before it in even ones; the
#                 report adds the two workers' CPU ratio, each repeat's and summed,
#                 and its steady rate
#   ARGS          passed on: --messages N (200000) --partitions P (6) --repeats R (1)
#                 --no-outcomes-topic (the worker reads no topic back: no learning barrier)
#                 --worked-floor (the floor run a second time doing the hint work on each
#                 input, examples/static_floor.rs --hint-work: the best a worker built like
#                 the floor could do, as one more side)
#                 --cached D (the cached path: D distinct trajectories, each sent N / D
#                 times, and a loopback model in the script that each one's first copy
#                 calls; the later copies are answered from the hint cache)
set -euo pipefail
cd "$(dirname "$0")/.."

out="${CARGO_TARGET_DIR:-target}/bench/static-hints.md"
note=""
perf_out=""
binary=""
broker_cpus=""
side_cpus=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --note) note=$2; shift 2 ;;
    --perf) perf_out=$2; shift 2 ;;
    --hintstream) binary=$2; shift 2 ;;
    --broker-cpus) broker_cpus=$2; shift 2 ;;
    --side-cpus) side_cpus=$2; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

if [ -n "$broker_cpus$side_cpus" ] && ! command -v taskset >/dev/null; then
  echo "bench-static-hints: --broker-cpus and --side-cpus need taskset (util-linux)" >&2
  exit 2
fi
scripts/kafka.sh install
python=$(scripts/python-venv.sh)
target="${CARGO_TARGET_DIR:-target}"
floor="$target/release/examples/static_floor"
cargo build --release --example static_floor
if [ -z "$binary" ]; then
  echo "bench-static-hints: building the release binary" >&2
  if [ -n "$perf_out" ]; then
    # Symbols kept for perf (the release profile strips them).
    cargo rustc --release --bin hintstream -- -C strip=none
  else
    cargo build --release --bin hintstream
  fi
  binary="$target/release/hintstream"
fi

port=$(scripts/free-port.sh)
tables=$(mktemp)
trap 'rm -f "$tables"; scripts/kafka.sh stop "$port"' EXIT
scripts/kafka.sh start "$port" >/dev/null

mkdir -p "$(dirname "$out")"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
broker_pid=$(cat "${KAFKA_STATE_DIR:-${TMPDIR:-/tmp}/hintstream-kafka}/node-$port/pid")
if [ -n "$broker_cpus" ]; then
  scripts/kafka.sh pin "$port" "$broker_cpus"
fi
${side_cpus:+taskset -c "$side_cpus"} "$python" scripts/bench_static_hints.py --bootstrap "127.0.0.1:$port" --hintstream "$binary" \
  --broker-pid "$broker_pid" --floor "$floor" \
  ${perf_out:+--perf "$perf_out"} ${args[@]+"${args[@]}"} >"$tables"
took=$(( $(date +%s) - started ))
{
  case " ${args[*]-} " in
    *" --cached "*) echo "# Stage 1's cached path (a model, repeated trajectories) against a Python passthrough on Apache Kafka" ;;
    *) echo "# Stage 1 static hints against a Python passthrough on Apache Kafka" ;;
  esac
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo ' (with local changes)')"
  echo "- machine: $(nproc) vCPU, $(free -g | awk '/Mem:/ {print $2}') GB RAM; load average before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg)${note:+; $note}"
  echo "- broker: Apache Kafka $(sed -n 's/^KAFKA_VERSION=//p' scripts/kafka.sh) (scripts/kafka.sh, one KRaft node), 127.0.0.1"
  echo "- CPUs: the broker on ${broker_cpus:-any}, the sides on ${side_cpus:-any}"
  echo "- command: \`scripts/bench-static-hints.sh ${broker_cpus:+--broker-cpus $broker_cpus }${side_cpus:+--side-cpus $side_cpus }${args[*]-}\` ($took s)"
  echo "- floor: examples/static_floor.rs, the worker's output (a copy of one of its hints, with its headers) under"
  echo "  its guarantee (an offset stored once every earlier output of its partition was acknowledged), no hint work"
  echo "- CPU s: the passthrough's Python process, the worker process, the floor's (librdkafka's threads included);"
  echo "  broker CPU s: the broker's JVM over the same span (each side's own traffic, group join included);"
  echo "  machine busy: the share of every core busy over the side's span (/proc/stat)"
  echo
  cat "$tables"
} >"$out"
cat "$out"
echo "bench-static-hints: report in $out" >&2
