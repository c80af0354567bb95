#!/usr/bin/env bash
# Fuzzes the decoders and the Python-literal parser with cargo-fuzz
# (libFuzzer, AddressSanitizer) for a fixed time per target. Not part of CI.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Runs on the stable toolchain: cargo-fuzz's flags (-Zsanitizer=address, the
# sancov passes) are nightly-only, so the script sets RUSTC_BOOTSTRAP=1
# (no nightly toolchain can be fetched where this runs). Installs cargo-fuzz
# from crates.io when missing. The corpus starts from the JSON Schema examples and
# the sample data, and grows in fuzz/corpus/TARGET. Exits 1 when any target
# found a crash (kept in fuzz/artifacts/TARGET).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-300}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode_arrow decode_failed decode_scored pyliteral)

export RUSTC_BOOTSTRAP=1
# The targets let caught panics (decoding's panic guard) through the default
# hook: with backtraces on, each one wrote ~60 lines, 270 MB of log in 10 min.
export RUST_BACKTRACE=0
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz

seed() {
  local target="$1" dir="fuzz/corpus/$1"
  mkdir -p "$dir"
  [ -n "$(ls -A "$dir" 2>/dev/null)" ] && return
  cp fuzz/seeds/"$target"/* "$dir"/
  local n=0 file="" examples=()
  case "$target" in
    decode_failed) file=examples/data/failed_trajectories.jsonl; examples=(schemas/examples/failed_trajectory/*/*.json) ;;
    decode_scored) file=examples/data/scored_rollouts.jsonl; examples=(schemas/examples/scored_rollout/*/*.json schemas/examples/step_end/*/*.json) ;;
    decode_arrow) cp fuzz/seeds/decode_scored/arrow-step.bin "$dir"/ ;;
  esac
  for f in "${examples[@]}"; do cp "$f" "$dir/$(basename "$(dirname "$f")")-$(basename "$f")"; done
  if [ -n "$file" ]; then
    while IFS= read -r line && [ $n -lt 50 ]; do n=$((n + 1)); printf '%s' "$line" > "$dir/sample-$n"; done < "$file"
  fi
}

summary=()
crashed=0
for target in "${targets[@]}"; do
  seed "$target"
  log="fuzz/$target.log"
  echo "fuzz: $target for ${seconds}s (log: $log)" >&2
  status=0
  cargo fuzz run "$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=1048576 \
    >"$log" 2>&1 || status=$?
  runs=$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(find "fuzz/artifacts/$target" -type f 2>/dev/null | wc -l)
  [ "$status" -eq 0 ] || crashed=1
  summary+=("$target: ${runs:-0} runs in ${seconds}s, exit $status, $crashes crash artifact(s)")
done
printf '%s\n' "${summary[@]}"
exit "$crashed"
