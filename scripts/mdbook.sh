#!/usr/bin/env bash
# mdBook, which builds the book in docs/ (docs/book.toml) into target/book/.
#
#   scripts/mdbook.sh install   build mdBook from crates.io into the cache (once; 5.6 CPU-minutes: ~14 min
#                               cold on 2 cores at load 8, a few minutes on an idle machine)
#   scripts/mdbook.sh build     install, then build the book; prints the path of its index.html
#   scripts/mdbook.sh path      install, then print the mdbook binary's path (last line)
#
# mdbook build does not check links: `cargo test --test it contract::book`
# does (every relative link and #anchor of README.md and docs/*.md).
# Cache: $HINTSTREAM_MDBOOK_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/hintstream/mdbook-<version>).
# Needs a Rust toolchain (cargo), which building hintstream needs anyway.
set -euo pipefail

# Pinned: the book's book.toml is written for mdBook 0.5.
MDBOOK_VERSION=0.5.4
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
CACHE="${HINTSTREAM_MDBOOK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hintstream/mdbook-$MDBOOK_VERSION}"
BIN="$CACHE/bin/mdbook"

say() { echo "mdbook: $*" >&2; }

# Seconds since T0 (a `date +%s.%N`), to a tenth.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}'; }

installed() {
  [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null)" = "mdbook v$MDBOOK_VERSION" ]
}

install() {
  installed && return 0
  command -v cargo >/dev/null 2>&1 || { say "cargo is missing: install a Rust toolchain (rustup)"; exit 1; }
  mkdir -p "$CACHE"
  # One build at a time: several callers may ask at once.
  exec 9>"$CACHE/.lock"
  flock 9
  if installed; then exec 9>&-; return 0; fi
  say "building mdBook $MDBOOK_VERSION from crates.io into $CACHE (a few minutes the first time)"
  local t0
  t0=$(date +%s.%N)
  # Without the `serve` and `watch` features (a web server and a file
  # watcher): `build` needs neither. Its own target dir, so that a
  # CARGO_TARGET_DIR set for hintstream is not filled with mdBook's build.
  local work
  work=$(mktemp -d)
  CARGO_TARGET_DIR="$work" cargo install --quiet --locked --root "$CACHE" \
    --no-default-features --features search "mdbook@$MDBOOK_VERSION"
  rm -rf "$work"
  exec 9>&-
  installed || { say "mdBook $MDBOOK_VERSION did not install into $CACHE"; exit 1; }
  say "installed in $(since "$t0") s"
}

case "${1:-}" in
  install)
    install
    ;;
  path)
    install
    echo "$BIN"
    ;;
  build)
    install
    "$BIN" build "$ROOT/docs" >&2
    echo "$ROOT/target/book/index.html"
    ;;
  *)
    echo "usage: $0 install | build | path" >&2
    exit 2
    ;;
esac
