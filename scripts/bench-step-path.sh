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
#   --vs PATH     another worker binary, side by side: the example runs
#                 2 x --rounds times on the one broker (after a warm-up, below),
#                 once with each worker in turn (this tree's, or --hintstream's, first in odd rounds,
#                 PATH first in even ones); the report adds each run's figures
#                 and their sums, each worker's against its own echo and the
#                 two workers' CPU ratio (not with --perf)
#   --rounds N    rounds of --vs [default: 4], after one invocation of PATH
#                 that warms the broker up and is not counted
#   EXAMPLE ARGS  passed to the example, e.g. --rows 16000,64000 --repeats 3
#                 --formats json,arrow --json-max-rows 64000 --no-baseline
#                 --wall-times (each step's times in UTC on stderr)
#                 --backlog (each step produced whole while the worker is stopped
#                 and the echo has no partition, timed from their release)
#                 --learning (hints that learn: hinted rows name their group's hint, written
#                 to a hints topic in one transaction before the run; the
#                 worker reads it and publishes an outcome a hint before its
#                 metrics, and so does the echo)
#                 --floor (a third side: the echo doing the work no worker can leave
#                 out, decode, assembly, kernel, metrics and encoding, on one task;
#                 the baseline table adds hintstream ÷ floor and floor ÷ echo)
#                 --exactly-once (the worker under kafka.delivery = "exactly_once",
#                 its outputs read read_committed; the baselines unchanged)
set -euo pipefail
cd "$(dirname "$0")/.."

out="${CARGO_TARGET_DIR:-target}/bench/step-path.md"
note=""
binary=""
perf_dir=""
broker_cpus=""
side_cpus=""
versus=""
rounds=""
example_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --note) note=$2; shift 2 ;;
    --hintstream) binary=$2; shift 2 ;;
    --perf) perf_dir=$2; shift 2 ;;
    --broker-cpus) broker_cpus=$2; shift 2 ;;
    --side-cpus) side_cpus=$2; shift 2 ;;
    --vs) versus=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) example_args+=("$1"); shift ;;
  esac
done

if [ -n "$broker_cpus$side_cpus" ] && ! command -v taskset >/dev/null; then
  echo "bench-step-path: --broker-cpus and --side-cpus need taskset (util-linux)" >&2
  exit 2
fi
if [ -n "$versus" ]; then
  rounds=${rounds:-4}
  if [ -n "$perf_dir" ]; then
    echo "bench-step-path: --vs and --perf together would put perf's overhead on one side only" >&2
    exit 2
  fi
  if [ ! -f "$versus" ] || [ ! -x "$versus" ]; then
    echo "bench-step-path: --vs $versus is not an executable file" >&2
    exit 2
  fi
  if ! [ "$rounds" -ge 1 ] 2>/dev/null; then
    echo "bench-step-path: --rounds takes a whole number of at least 1, not '$rounds'" >&2
    exit 2
  fi
elif [ -n "$rounds" ]; then
  echo "bench-step-path: --rounds is for --vs" >&2
  exit 2
fi
scripts/kafka.sh install
target="${CARGO_TARGET_DIR:-target}"
if [ -z "$binary" ] || [ ! -x "$target/release/examples/step_path" ]; then
  echo "bench-step-path: building release binaries" >&2
  cargo build --release --bin hintstream --example step_path
fi
binary=${binary:-$target/release/hintstream}

port=$(scripts/free-port.sh)
tables=$(mktemp)
wrapper=$(mktemp)
runs=$(mktemp)
trap 'rm -f "$tables" "$wrapper" "$runs"; scripts/kafka.sh stop "$port"' EXIT
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
# The example's tables with worker $1.
run_example() {
  ${side_cpus:+taskset -c "$side_cpus"} "$target/release/examples/step_path" --bootstrap "127.0.0.1:$port" \
    --hintstream "$1" ${example_args[@]+"${example_args[@]}"}
}

# Each --vs run's tables under a heading, then a table of the figures the
# sums are made of and the sums: a row of the worker's table has more than
# ten cells (end-to-end "median / min" in the 8th, intake the 9th, the
# worker's CPU the 12th), a row of the echo's fewer (the echo's end-to-end
# in the 3rd; with --floor the floor's three cells after its six).
side_by_side() {
  local runs=$1
  awk -F'|' '
    function number(cell) { return cell ~ /^ *[0-9]/ ? cell + 0 : "" }
    # A tenth kept under 100 ms, as the example writes it.
    function cell(v) { return v == "" ? "" : (v < 100 ? sprintf("%.1f", v) : sprintf("%d", v)) }
    function whole(v) { return v == "" ? "" : sprintf("%d", v) }
    /^## run / { side = $0; sub(/^## run [0-9]+: /, "", side); round = $0; sub(/^## run /, "", round); sub(/:.*/, "", round); round += 0; if (round > rounds) rounds = round; next }
    /^\| [0-9]/ {
      rows = $2; input = $3; gsub(/^ +| +$/, "", rows); gsub(/^ +| +$/, "", input)
      key = rows "|" input
      # In the order the example ran them.
      if (!(key in seen)) { seen[key] = 1; order[++keys] = key }
      if (NF > 12) {
        split($9, e, "/"); hs[round, side, key] = number(e[1]); intake[round, side, key] = number($10); cpu[round, side, key] = number($13)
      } else {
        split($4, e, "/"); echo_[round, side, key] = number(e[1])
      }
    }
    END {
      print "### Side by side: hintstream and --vs, the same broker, in turn"
      print ""
      print "| round | side | rows | input | end-to-end ms (median) | intake ms | worker CPU ms | echo ms | ÷ echo |"
      print "|---:|---|---:|---|---:|---:|---:|---:|---:|"
      split("hintstream --vs", sides, " ")
      for (r = 1; r <= rounds; r++) for (i = 1; i <= 2; i++) for (n = 1; n <= keys; n++) {
        s = sides[i]; k = order[n]
        if (!((r, s, k) in hs)) continue
        split(k, kk, "|")
        ec = (r, s, k) in echo_ ? echo_[r, s, k] : ""
        ratio = ec != "" && ec > 0 && hs[r, s, k] != "" ? sprintf("%.2fx", hs[r, s, k] / ec) : ""
        printf "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r, s, kk[1], kk[2], cell(hs[r, s, k]), whole(intake[r, s, k]), whole(cpu[r, s, k]), cell(ec), ratio
        sum_hs[s, k] += hs[r, s, k]; sum_intake[s, k] += intake[r, s, k]; sum_cpu[s, k] += cpu[r, s, k]
        if (ec != "") { sum_echo[s, k] += ec; echoes[s, k]++ }
      }
      print ""
      print "| side | rows | input | end-to-end ms, summed | intake ms, summed | worker CPU ms, summed | echo ms, summed | ÷ echo, summed |"
      print "|---|---:|---|---:|---:|---:|---:|---:|"
      for (i = 1; i <= 2; i++) for (n = 1; n <= keys; n++) {
        s = sides[i]; k = order[n]
        if (!((s, k) in sum_hs)) continue
        split(k, kk, "|")
        ec = echoes[s, k] > 0 ? sum_echo[s, k] : ""
        ratio = ec != "" && ec > 0 ? sprintf("%.2fx", sum_hs[s, k] / ec) : ""
        printf "| %s | %s | %s | %s | %d | %d | %s | %s |\n", s, kk[1], kk[2], cell(sum_hs[s, k]), sum_intake[s, k], sum_cpu[s, k], cell(ec), ratio
      }
      print ""
      # The CPU column counts 10 ms ticks: a ratio of fewer is not shown.
      for (n = 1; n <= keys; n++) {
        k = order[n]
        if (sum_cpu["--vs", k] >= 100 && sum_cpu["hintstream", k] >= 100) {
          split(k, kk, "|")
          printf "hintstream CPU ÷ --vs CPU, %s %s, summed: %.3f\n", kk[1], kk[2], sum_cpu["hintstream", k] / sum_cpu["--vs", k]
        }
      }
    }' "$runs"
}

started=$(date +%s)
if [ -z "$versus" ]; then
  run_example "$binary" >"$tables"
else
  # A fresh broker's first invocation is slower than the later ones (in
  # three sets of 1M-row steps, the first timed step's chunks took 2.1-2.8x
  # as long as the next invocation's): one of --vs goes first, not counted.
  echo "bench-step-path: warming the broker up with one invocation of --vs, not counted" >&2
  run_example "$versus" >/dev/null
  for round in $(seq "$rounds"); do
    order=("hintstream:$binary" "--vs:$versus")
    if [ $((round % 2)) = 0 ]; then order=("--vs:$versus" "hintstream:$binary"); fi
    for side_binary in "${order[@]}"; do
      side=${side_binary%%:*}
      echo "bench-step-path: round $round of $rounds, $side" >&2
      { echo "## run $round: $side"; echo; run_example "${side_binary#*:}"; echo; } >>"$runs"
    done
  done
  { side_by_side "$runs"; echo; cat "$runs"; } >"$tables"
fi
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
  echo "- command: \`scripts/bench-step-path.sh ${broker_cpus:+--broker-cpus $broker_cpus }${side_cpus:+--side-cpus $side_cpus }${versus:+--vs $versus --rounds $rounds }${example_args[*]-}\` ($took s)"
  echo
  cat "$tables"
} >"$out"
cat "$out"
echo "bench-step-path: report in $out" >&2
