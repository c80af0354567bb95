#!/usr/bin/env bash
# Installs what building and testing hintstream needs on a fresh machine:
#  - cmake, which rdkafka-sys uses to build librdkafka 2.12 from source;
#  - docker-compose (Debian's, v1), which validates docker-compose.yml in the
#    tests without a Docker engine, and python3-venv for the Python client tests;
#  - libcurl headers: librdkafka 2.12's cmake build includes <curl/curl.h>
#    even with curl disabled (its config header defines the OIDC switch to 0,
#    and rdkafka_conf.c tests it with #ifdef);
#  - OpenSSL headers and pkg-config: librdkafka is built with TLS and
#    SASL/SCRAM (rdkafka's `ssl` feature links the system OpenSSL);
#  - promtool, which checks and unit-tests deploy/prometheus in the tests:
#    taken alone out of Debian's `prometheus` package (its server, web assets
#    and dependencies are not needed);
#  - Java 17+ and Maven, which run and resolve the Apache Kafka broker the
#    tests start (scripts/kafka.sh; scripts/test.sh resolves its jars);
#  - openssl, which makes the secured-cluster tests' certificates.
# Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
[ -f /usr/include/curl/curl.h ] || [ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || need_apt+=(libcurl4-openssl-dev)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
[ -f /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# The broker: Kafka 4 needs Java 17 or newer.
java_major=$(java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}' || true)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then need_apt+=(default-jre-headless); fi
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# Validates docker-compose.yml in the tests (no Docker engine needed).
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
# The Python client tests make a venv.
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv)
# Headless Chromium renders the eval report in tests/it/hints/eval.rs.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
need_promtool=0
command -v promtool >/dev/null 2>&1 || need_promtool=1
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
if [ ${#need_apt[@]} -gt 0 ] || [ $need_promtool = 1 ]; then
  $sudo apt-get update -qq
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ $need_promtool = 1 ]; then
  echo "setup: installing promtool (from Debian's prometheus package)" >&2
  deb_dir=$(mktemp -d)
  chmod 0777 "$deb_dir"   # apt-get download runs as _apt where it can
  (cd "$deb_dir" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb unpacked)
  $sudo install -m 0755 "$deb_dir/unpacked/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$deb_dir"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is missing; install the Rust toolchain (rustup) first" >&2
  exit 1
fi
