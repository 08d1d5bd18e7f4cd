#!/usr/bin/env bash
# The real-model benchmark (issue 16): specgen against mlx-lm's plain greedy decoding on the
# prompt sets in benchmarks/prompts/, in three configurations:
#   float32  SmolLM2-135M-Instruct dequantized to float32, OpenBLAS (memory-bound, like a Mac)
#   4bit     the same model as shipped (this CPU's quantized matmul: k positions cost ~k x one)
#   demo     stories260K with the bundled BLAS (overhead-bound)
# plus float32 chat with --memory of the model's own answers to 24 other instructions.
# Usage: benchmarks/real_model.sh [float32|4bit|demo|memory|all]; writes JSON to benchmarks/results/.
# Knobs (environment): PROMPTS (per set, default 24), TOKENS (default 96), REPEATS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
SPECGEN=${SPECGEN:-.venv/bin/specgen}
MODEL=${MODEL:-../shared/models/smollm2-135m-instruct-4bit}
OPENBLAS=/usr/lib/x86_64-linux-gnu/libopenblas.so.0
PROMPTS=${PROMPTS:-24} TOKENS=${TOKENS:-96} REPEATS=${REPEATS:-2}
OUT=benchmarks/results; mkdir -p "$OUT"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

bench() {  # bench CONFIG SET [specgen flags...]
  local config=$1 set=$2; shift 2
  head -n "$PROMPTS" "benchmarks/prompts/$set.jsonl" > "$TMP/$set.jsonl"
  "$SPECGEN" bench --prompts "$TMP/$set.jsonl" -n "$TOKENS" --repeats "$REPEATS" --json "$@" \
    > "$OUT/$config-$set.json"
  python3 - "$OUT/$config-$set.json" "$config" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"{sys.argv[2]:8} {r['set']:9} {r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
          f"  predicted {r['predicted_speedup']:.2f}x  {r['tokens_per_step']:.2f} tok/step"
          f"  {r['baseline_tps']:.1f} -> {r['specgen_tps']:.1f} tok/s  identical={r['identical']}  blas={r['blas']}")
PY
}

what=${1:-all}
if [[ $what == float32 || $what == all ]]; then
  [[ -e $OPENBLAS ]] || { echo "needs OpenBLAS: apt-get install -y libopenblas0-pthread" >&2; exit 1; }
  for set in grounded code_fix code_edit chat; do
    LD_PRELOAD=$OPENBLAS bench float32 "$set" -m "$MODEL" --dtype float32
  done
fi
if [[ $what == memory || $what == all ]]; then
  .venv/bin/python benchmarks/seed_memory.py "$MODEL" ../shared/traces/smollm2_chat_topk.jsonl || true
  LD_PRELOAD=$OPENBLAS bench float32-memory chat -m "$MODEL" --dtype float32 --memory
fi
if [[ $what == 4bit || $what == all ]]; then
  for set in grounded code_fix code_edit chat; do bench 4bit "$set" -m "$MODEL"; done
fi
if [[ $what == demo || $what == all ]]; then
  for set in grounded code_fix code_edit chat; do bench demo "$set" -m demo; done
fi
