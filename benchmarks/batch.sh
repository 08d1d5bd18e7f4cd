#!/usr/bin/env bash
# One `specgen run --prompts` over N prompts against N separate `specgen run` processes; a single
# run's start-up (import, model load, cached calibration) is its wall time less its own prefill and
# decode (--json). The issue's bound: batch <= singles - (N - 1) * median start-up.
# Usage: benchmarks/batch.sh [MODEL] [SET] [N] [TOKENS]
set -euo pipefail
model=${1:-demo}; set=${2:-chat}; n=${3:-24}; tokens=${4:-96}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
head -n "$n" "$(dirname "$0")/prompts/$set.jsonl" > "$dir/in.jsonl"
specgen run -q -m "$model" -n 1 "warm-up" > /dev/null   # the calibration is measured once, cached
now() { python3 -c 'import time; print(time.perf_counter())'; }
t0=$(now); specgen run -q -m "$model" -n "$tokens" --prompts "$dir/in.jsonl" -o "$dir/batch.jsonl"; t1=$(now)
i=0
while IFS= read -r line; do
  i=$((i + 1))
  python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prompt"])' "$line" > "$dir/p$i.txt"
done < "$dir/in.jsonl"
t2=$(now)
for j in $(seq 1 "$i"); do
  a=$(now); specgen run -q -m "$model" -n "$tokens" --json -f "$dir/p$j.txt" >> "$dir/singles.jsonl"; b=$(now)
  echo "$a $b" >> "$dir/walls.txt"
done
t3=$(now)
python3 - "$dir" "$t0" "$t1" "$t2" "$t3" "$i" "$model" <<'PY'
import json, statistics, sys
d, t0, t1, t2, t3, n, model = sys.argv[1], *map(float, sys.argv[2:6]), int(sys.argv[6]), sys.argv[7]
b = [json.loads(l) for l in open(f"{d}/batch.jsonl")]
s = [json.loads(l) for l in open(f"{d}/singles.jsonl")]
walls = [float(y) - float(x) for x, y in (l.split() for l in open(f"{d}/walls.txt"))]
batch, singles = t1 - t0, t3 - t2
startup = statistics.median(w - r["prefill_s"] - r["decode_s"] for w, r in zip(walls, s))
same = [x["text"] for x in b] == [x["text"] for x in s]
print(json.dumps({"model": model, "prompts": n, "batch_s": round(batch, 2), "singles_s": round(singles, 2),
                  "generation_s": {"batch": round(sum(r["prefill_s"] + r["decode_s"] for r in b), 2),
                                   "singles": round(sum(r["prefill_s"] + r["decode_s"] for r in s), 2)},
                  "startup_s": round(startup, 2), "bound_s": round(singles - (n - 1) * startup, 2),
                  "within_bound": batch <= singles - (n - 1) * startup, "identical_texts": same}))
PY
