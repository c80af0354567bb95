#!/usr/bin/env bash
# Prints a port of 127.0.0.1 for a server the calling script starts: no one listens on it or
# on the port after it (a Kafka node from scripts/kafka.sh puts its controller there), and
# neither is one of AVOID, nor the port after one of them (ports picked already for servers
# not listening yet).
#
#   scripts/free-port.sh [AVOID...]
#
# Picked from 20000 up to below the kernel's ephemeral range, where no outgoing connection
# takes it before its server binds it; when that range starts too low to leave room, from
# 20000-49999. At most 50 tries, then an error.
set -euo pipefail

avoid=()
for a in "$@"; do
  case "$a" in
    '' | *[!0-9]* | 0?*)
      echo "free-port: a port to avoid must be a decimal number without leading zeros, not '$a'" >&2
      exit 2
      ;;
  esac
  avoid+=("$a")
done

ephemeral=32768
if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
  read -r ephemeral _ </proc/sys/net/ipv4/ip_local_port_range
fi
low=20000
# The port and the one after it, both below the range.
span=$((ephemeral - 1 - low))
[ "$span" -ge 1000 ] || span=30000

taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
avoided() {
  local a
  for a in ${avoid[@]+"${avoid[@]}"}; do
    # The pair port, port + 1 against the pair a, a + 1.
    if [ "$1" -ge $((a - 1)) ] && [ "$1" -le $((a + 1)) ]; then
      return 0
    fi
  done
  return 1
}

for _ in $(seq 50); do
  port=$((low + (RANDOM * 32768 + RANDOM) % span))
  if ! avoided "$port" && ! taken "$port" && ! taken "$((port + 1))"; then
    echo "$port"
    exit 0
  fi
done
echo "free-port: no free pair of ports of 127.0.0.1 in 50 tries" >&2
exit 1
