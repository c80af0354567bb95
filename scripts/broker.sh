#!/usr/bin/env bash
# The Kafka-protocol broker for tests and local runs: tansu 0.6.0 with memory
# storage on 127.0.0.1 (tansu listens on IPv4 only).
#
#   scripts/broker.sh install        install tansu when it is missing (~20 min cold)
#   scripts/broker.sh start [PORT]   start it in the background (default 9092), wait until it answers
#   scripts/broker.sh stop [PORT]    stop the broker started on PORT
#   scripts/broker.sh wait [PORT]    wait until a broker answers on PORT
#
# Why 0.6.0: later releases (renamed nisshi) need a newer rustc. Why those
# features: the default build has no storage engine (memory:// fails with
# FeatureNotEnabled); dynostore gives memory:// and s3://, libsql sqlite://.
set -euo pipefail

TANSU_VERSION=0.6.0
CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
STATE_DIR="${TMPDIR:-/tmp}/hintstream-broker"

tansu_bin() {
  if [ -n "${TANSU_BIN:-}" ]; then echo "$TANSU_BIN"; return; fi
  command -v tansu 2>/dev/null || echo "$CARGO_BIN/tansu"
}

install() {
  local bin; bin=$(tansu_bin)
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    return 0
  fi
  echo "broker: installing tansu $TANSU_VERSION (cargo install; about 20 minutes on 2 cores the first time)" >&2
  cargo install --locked "tansu@$TANSU_VERSION" --features dynostore,libsql
}

wait_port() {
  local port=$1 tries=${2:-150}
  for _ in $(seq "$tries"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "broker: nothing answers on 127.0.0.1:$port" >&2
  return 1
}

start() {
  local port=${1:-9092} bin; bin=$(tansu_bin)
  [ -x "$bin" ] || { echo "broker: tansu is not installed; run: scripts/broker.sh install" >&2; exit 1; }
  mkdir -p "$STATE_DIR"
  local url="tcp://127.0.0.1:$port"
  nohup "$bin" broker --listener-url "$url" --advertised-listener-url "$url" \
    --storage-engine memory://tansu/ >"$STATE_DIR/tansu-$port.log" 2>&1 &
  echo $! >"$STATE_DIR/tansu-$port.pid"
  wait_port "$port"
  echo "broker: tansu on 127.0.0.1:$port (log $STATE_DIR/tansu-$port.log)" >&2
}

stop() {
  local port=${1:-9092} pidfile="$STATE_DIR/tansu-${1:-9092}.pid"
  if [ -f "$pidfile" ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  fi
}

case "${1:-}" in
  install) install ;;
  start) start "${2:-9092}" ;;
  stop) stop "${2:-9092}" ;;
  wait) wait_port "${2:-9092}" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
