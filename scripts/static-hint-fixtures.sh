#!/usr/bin/env bash
# Rewrites the expected texts of the static-hint fixtures
# (schemas/fixtures/static_hint/NN-name.json: {"trajectory": ..., "hint": ...})
# with what the Rust code builds: every trajectory goes through
# `hintstream eval` with no model API configured (static_fallback), and each
# fixture's "hint" becomes the hint of its group in report.json. The Python
# package's tests (python/tests/test_static_hint.py) check that
# hintstream.static_hint gives the same texts. Rerun after changing the
# static hint in src/llm/prompt.rs or src/llm/pyliteral.rs.
#
#   scripts/static-hint-fixtures.sh            (builds the debug binary first)
#   CARGO_BIN_EXE_hintstream=path/to/hintstream scripts/static-hint-fixtures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=schemas/fixtures/static_hint
if [ -z "${CARGO_BIN_EXE_hintstream:-}" ]; then
  cargo build --quiet --bin hintstream
  CARGO_BIN_EXE_hintstream="${CARGO_TARGET_DIR:-$root/target}/debug/hintstream"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$dir" "$work/input.jsonl" <<'PY'
import glob, json, sys
fixtures, out = sys.argv[1], sys.argv[2]
seen = set()
with open(out, "w") as f:
    for path in sorted(glob.glob(fixtures + "/*.json")):
        t = json.load(open(path, encoding="utf-8"))["trajectory"]
        key = (t["run_id"], t["step"], t["instance_id"])
        assert key not in seen, f"{path}: another fixture has the group {key}; give each its own instance_id"
        seen.add(key)
        f.write(json.dumps(t, ensure_ascii=False) + "\n")
PY

# No model API: the eval runs stage 1's synthesis with the static fallback.
# Run from the scratch folder so that no ./hintstream.toml is picked up.
(cd "$work" && env -u ANTHROPIC_API_KEY -u ANTHROPIC_BASE_URL -u OPENAI_API_KEY -u OPENAI_BASE_URL \
  -u OPENROUTER_API_KEY -u OPENROUTER_BASE_URL HINTSTREAM_LLM__PROVIDER=none \
  "$CARGO_BIN_EXE_hintstream" eval --input input.jsonl --out out >eval.log 2>&1) || {
  cat "$work/eval.log" >&2
  exit 1
}

python3 - "$dir" "$work/out/report.json" <<'PY'
import glob, json, sys
fixtures, report = sys.argv[1], json.load(open(sys.argv[2], encoding="utf-8"))
hints = {}
for group in report["hints"]:
    (hint,) = group["hints"]
    assert hint["category"] == "static_fallback", group
    hints[group["trajectory_id"]] = hint["hint"]
changed = 0
for path in sorted(glob.glob(fixtures + "/*.json")):
    fixture = json.load(open(path, encoding="utf-8"))
    text = hints[fixture["trajectory"]["trajectory_id"]]
    if fixture.get("hint") != text:
        changed += 1
        fixture["hint"] = text
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fixture, f, indent=2, ensure_ascii=False)
            f.write("\n")
print(f"static-hint fixtures: {len(hints)} checked, {changed} rewritten", file=sys.stderr)
PY
