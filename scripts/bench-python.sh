#!/usr/bin/env bash
# Stage 2's compute path against the same algorithm in pure Python and in
# numpy, side by side on the same 1M rows (8 per group, 10% hinted, shuffled
# string ids); checks that all three agree and prints the ratios.
#
#   scripts/bench-python.sh [ROWS]     (default 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-1000000}
work=target/bench-python
venv=target/bench-python/venv
mkdir -p "$work"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/pip" install -q numpy
cargo build --release --example bench_compute
[ -f "$work/rows-$rows.jsonl" ] || "$venv/bin/python" scripts/bench_python.py generate "$work/rows-$rows.jsonl" "$rows"
rust=$(target/release/examples/bench_compute "$work/rows-$rows.jsonl" "$work/out.rust.txt" 5 | awk '/rust_ms/ {print $2}')
read -r py np < <("$venv/bin/python" scripts/bench_python.py time "$work/rows-$rows.jsonl" "$work/out" | awk '{print $2}' | paste -sd' ')
"$venv/bin/python" - "$work" <<'PY'
import sys
w = sys.argv[1]
load = lambda p: [float(x) for x in open(p)]
r, p, n = load(w + "/out.rust.txt"), load(w + "/out.python.txt"), load(w + "/out.numpy.txt")
rel = lambda a, b: max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))
print("max relative difference: rust vs python %.3g, rust vs numpy %.3g" % (rel(r, p), rel(r, n)))
assert len(r) == len(p) == len(n) and rel(r, p) < 1e-9 and rel(r, n) < 1e-9, "implementations disagree"
PY
printf '%-28s %12s %10s\n' "implementation ($rows rows)" "median ms" "vs rust"
printf '%-28s %12.1f %10s\n' "rust compute path (cpu)" "$rust" "1.0x"
printf '%-28s %12.1f %9.1fx\n' "numpy" "$np" "$(echo "$np / $rust" | bc -l)"
printf '%-28s %12.1f %9.1fx\n' "pure python loop" "$py" "$(echo "$py / $rust" | bc -l)"
