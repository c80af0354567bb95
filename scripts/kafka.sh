#!/usr/bin/env bash
# Apache Kafka 4.1.1 (KRaft, broker and controller in one JVM) on
# 127.0.0.1, for tests and local runs, from the jars Maven resolves for
# scripts/kafka/pom.xml.
#
#   scripts/kafka.sh install              resolve the jars into the cache (once; ~1 min cold)
#   scripts/kafka.sh libs                 install, then print the jar folder (last line)
#   scripts/kafka.sh start [PORT]         start a fresh node on PORT (default 9092; controller on PORT+1),
#                                         wait until it answers metadata, print its bootstrap servers
#   scripts/kafka.sh stop [PORT]          stop that node (SIGTERM, SIGKILL after 30 s) and delete its data (its log stays)
#   scripts/kafka.sh pin PORT CPUS        pin that node's JVM, every thread (and those it starts later), to CPUS
#                                         (taskset's list: 0, 0-3, 0,2), for benchmarks
#   scripts/kafka.sh cluster start        start a fresh three-node cluster (nodes 1..3), print its bootstrap servers
#   scripts/kafka.sh cluster stop         stop all three
#   scripts/kafka.sh cluster kill N       SIGKILL node N
#   scripts/kafka.sh cluster restart N    stop node N if it runs, start it again on its data, wait until it answers
#
# Cluster node N listens on BASE+N-1 and its controller on BASE+N+9, BASE
# being KAFKA_CLUSTER_PORT (default 39092); every node is a controller and a
# broker, topics default to replication 3 and min.insync.replicas=2.
# KAFKA_EXTRA_PROPERTIES (space-separated key=value) adds server.properties
# lines to the nodes started, after the tests' ones (e.g. a benchmark's
# group.consumer.session.timeout.ms=45000).
# The JVM runs with scripts/kafka/jvm.options (Kafka's own launcher's, a
# heap of 512 MB), then HINTSTREAM_KAFKA_JVM_OPTS (space-separated, later
# options winning; e.g. a benchmark's -Xlog:gc:file=/tmp/gc.log).
# Jars: $HINTSTREAM_KAFKA_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/hintstream/kafka-4.1.1).
# Nodes' data and logs: $KAFKA_STATE_DIR (default ${TMPDIR:-/tmp}/hintstream-kafka).
# Needs Java 17 or newer and Maven (Debian: apt-get install default-jre-headless maven).
set -euo pipefail

KAFKA_VERSION=4.1.1
HERE="$(cd "$(dirname "$0")" && pwd)"
POM="$HERE/kafka/pom.xml"
NODE_PROPERTIES="$HERE/kafka/node.properties"
JVM_OPTIONS="$HERE/kafka/jvm.options"
LOG4J="$HERE/kafka/log4j2.properties"
CACHE="${HINTSTREAM_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hintstream/kafka-$KAFKA_VERSION}"
LIBS="$CACHE/libs"
STATE="${KAFKA_STATE_DIR:-${TMPDIR:-/tmp}/hintstream-kafka}"
CLUSTER_BASE="${KAFKA_CLUSTER_PORT:-39092}"

say() { echo "kafka: $*" >&2; }

# Seconds since T0 (a `date +%s.%N`), to a tenth.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}'; }

need_java() {
  command -v java >/dev/null 2>&1 || { say "java is missing: install Java 17 or newer (Debian: apt-get install default-jre-headless)"; exit 1; }
  local major
  major=$(java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}')
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    say "Kafka $KAFKA_VERSION needs Java 17 or newer; java -version says ${major:-nothing}"
    exit 1
  fi
}

installed() {
  [ -f "$CACHE/pom.sha256" ] && [ "$(cat "$CACHE/pom.sha256")" = "$(sha256sum "$POM" | cut -d' ' -f1)" ]
}

install() {
  installed && return 0
  need_java
  command -v mvn >/dev/null 2>&1 || { say "mvn is missing: install Maven (Debian: apt-get install maven)"; exit 1; }
  mkdir -p "$CACHE"
  # One resolver at a time: test binaries may all ask at once.
  exec 9>"$CACHE/.lock"
  flock 9
  if installed; then exec 9>&-; return 0; fi
  say "resolving Kafka $KAFKA_VERSION's jars with Maven into $LIBS (about a minute the first time)"
  rm -rf "$LIBS.tmp"
  # (mvn -q still prints colour resets: dropped.)
  mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DoutputDirectory="$LIBS.tmp" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  sha256sum "$POM" | cut -d' ' -f1 >"$CACHE/pom.sha256"
  exec 9>&-
  say "$(find "$LIBS" -name '*.jar' | wc -l) jars in $LIBS"
}

# A java command on the broker's classpath; the tools log warnings only.
kafka_java() {
  java -Dlog4j2.configurationFile="$LOG4J" -Dhintstream.kafka.log.level=WARN -cp "$LIBS/*" "$@"
}

# A KRaft cluster id: 16 random bytes, base64url without padding, drawn
# again while it starts with '-' (StorageTool would read it as an option).
cluster_id() {
  local id=-
  while [ "${id#-}" != "$id" ]; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
  done
  echo "$id"
}

# write_properties DIR NODE_ID PORT CONTROLLER_PORT VOTERS REPLICATION MIN_ISR
write_properties() {
  local dir=$1 id=$2 port=$3 ctl=$4 voters=$5 rf=$6 isr=$7
  {
    cat "$NODE_PROPERTIES"
    echo "process.roles=broker,controller"
    echo "node.id=$id"
    echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl"
    echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port"
    echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    echo "controller.quorum.voters=$voters"
    echo "log.dirs=$dir/data"
    echo "default.replication.factor=$rf"
    echo "min.insync.replicas=$isr"
    echo "offsets.topic.replication.factor=$rf"
    echo "transaction.state.log.replication.factor=$rf"
    echo "transaction.state.log.min.isr=$isr"
    echo "share.coordinator.state.topic.replication.factor=$rf"
    echo "share.coordinator.state.topic.min.isr=$isr"
    for line in ${KAFKA_EXTRA_PROPERTIES:-}; do echo "$line"; done
  } >"$dir/server.properties"
}

format() {
  local dir=$1 id=$2
  kafka_java kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 || {
    cat "$dir/format.log" >&2
    say "formatting $dir failed"
    exit 1
  }
}

running() {
  local dir=$1
  [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null
}

launch() {
  local dir=$1
  local options=() extra=()
  [ -r "$JVM_OPTIONS" ] || { say "$JVM_OPTIONS is missing"; exit 1; }
  mapfile -t options < <(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e '/^#/d' -e '/^$/d' "$JVM_OPTIONS")
  read -r -a extra <<<"${HINTSTREAM_KAFKA_JVM_OPTS:-}"
  nohup java "${options[@]}" "${extra[@]}" -Dlog4j2.configurationFile="$LOG4J" -cp "$LIBS/*" \
    kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
}

# Whether 127.0.0.1:PORT answers a Metadata request (v4, all topics) with
# at least one broker: the node has caught up and serves clients.
answers_metadata() {
  local port=$1 reply
  reply=$(
    exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    # size 23 | api_key 3 (Metadata) | version 4 | correlation id 1 |
    # client id "kafka.sh" | topics: null (all) | allow_auto_topic_creation: false
    printf '\x00\x00\x00\x17\x00\x03\x00\x04\x00\x00\x00\x01\x00\x08kafka.sh\xff\xff\xff\xff\x00' >&3
    # size | correlation id | throttle time | broker count
    timeout 3 head -c 16 <&3 | od -An -tx1 | tr -d ' \n'
  ) || return 1
  [ ${#reply} -eq 32 ] && [ "${reply:8:8}" = 00000001 ] && [ $((16#${reply:24:8})) -ge 1 ]
}

# Waits until the node in DIR answers metadata on PORT.
wait_ready() {
  local dir=$1 port=$2 within=${3:-120} started=$SECONDS
  until answers_metadata "$port"; do
    if ! running "$dir"; then
      tail -n 30 "$dir/kafka.log" >&2 || true
      say "the node in $dir exited before it answered on $port"
      exit 1
    fi
    if [ $((SECONDS - started)) -ge "$within" ]; then
      say "127.0.0.1:$port did not answer metadata within ${within}s (log: $dir/kafka.log)"
      exit 1
    fi
    sleep 0.2
  done
}

stop_dir() {
  local dir=$1
  running "$dir" || { rm -f "$dir/pid"; return 0; }
  local pid; pid=$(cat "$dir/pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 150); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$dir/pid"; return 0; }
    sleep 0.2
  done
  say "node $pid did not stop within 30 s: SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

start() {
  local port=$1 ctl=$(($1 + 1)) dir="$STATE/node-$1"
  install
  need_java
  if running "$dir"; then
    say "a node already runs on $port (pid $(cat "$dir/pid")); stop it with: scripts/kafka.sh stop $port"
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  write_properties "$dir" 1 "$port" "$ctl" "1@127.0.0.1:$ctl" 1 1
  format "$dir" "$(cluster_id)"
  local t0; t0=$(date +%s.%N)
  launch "$dir"
  wait_ready "$dir" "$port"
  say "Kafka $KAFKA_VERSION on 127.0.0.1:$port, pid $(cat "$dir/pid"), answered metadata $(since "$t0") s after launch (log $dir/kafka.log)"
  echo "127.0.0.1:$port"
}

stop() {
  stop_dir "$STATE/node-$1"
  # A single node always starts fresh, so its data is no use once it
  # stopped (a benchmark's run leaves gigabytes); its log stays.
  rm -rf "$STATE/node-$1/data"
}

node_port() { echo $((CLUSTER_BASE + $1 - 1)); }
node_ctl() { echo $((CLUSTER_BASE + $1 + 9)); }
node_dir() { echo "$STATE/cluster-$CLUSTER_BASE/node-$1"; }

cluster_bootstrap() {
  local n out=""
  for n in 1 2 3; do out="$out${out:+,}127.0.0.1:$(node_port "$n")"; done
  echo "$out"
}

check_node() {
  case "${1:-}" in
    1 | 2 | 3) ;;
    *) say "the cluster's nodes are 1, 2 and 3 (got '${1:-}')"; exit 2 ;;
  esac
}

cluster() {
  local verb=${1:-} n
  case "$verb" in
    start)
      install
      need_java
      for n in 1 2 3; do
        if running "$(node_dir "$n")"; then
          say "cluster node $n already runs; stop it with: scripts/kafka.sh cluster stop"
          exit 1
        fi
      done
      local id voters="" t0
      id=$(cluster_id)
      for n in 1 2 3; do voters="$voters${voters:+,}$n@127.0.0.1:$(node_ctl "$n")"; done
      rm -rf "$STATE/cluster-$CLUSTER_BASE"
      for n in 1 2 3; do
        mkdir -p "$(node_dir "$n")"
        write_properties "$(node_dir "$n")" "$n" "$(node_port "$n")" "$(node_ctl "$n")" "$voters" 3 2
        format "$(node_dir "$n")" "$id" &
      done
      wait
      t0=$(date +%s.%N)
      for n in 1 2 3; do launch "$(node_dir "$n")"; done
      for n in 1 2 3; do wait_ready "$(node_dir "$n")" "$(node_port "$n")"; done
      say "three-node Kafka $KAFKA_VERSION cluster answered metadata $(since "$t0") s after launch (logs $STATE/cluster-$CLUSTER_BASE/node-N/kafka.log)"
      cluster_bootstrap
      ;;
    stop)
      for n in 1 2 3; do stop_dir "$(node_dir "$n")" & done
      wait
      ;;
    kill)
      check_node "${2:-}"
      local dir; dir=$(node_dir "$2")
      if running "$dir"; then kill -9 "$(cat "$dir/pid")"; fi
      rm -f "$dir/pid"
      ;;
    restart)
      check_node "${2:-}"
      local dir; dir=$(node_dir "$2")
      [ -f "$dir/server.properties" ] || { say "no cluster node $2 in $dir: run scripts/kafka.sh cluster start"; exit 1; }
      need_java
      stop_dir "$dir"
      launch "$dir"
      wait_ready "$dir" "$(node_port "$2")"
      say "cluster node $2 is back on 127.0.0.1:$(node_port "$2")"
      cluster_bootstrap
      ;;
    *) sed -n '2,29p' "$0" >&2; exit 2 ;;
  esac
}

case "${1:-}" in
  install) install ;;
  libs) install; echo "$LIBS" ;;
  start) start "${2:-9092}" ;;
  stop) stop "${2:-9092}" ;;
  pin) taskset -a -p -c "${3:?scripts/kafka.sh pin PORT CPUS}" "$(cat "$STATE/node-${2:?scripts/kafka.sh pin PORT CPUS}/pid")" >/dev/null ;;
  cluster) shift; cluster "$@" ;;
  *) sed -n '2,29p' "$0" >&2; exit 2 ;;
esac
