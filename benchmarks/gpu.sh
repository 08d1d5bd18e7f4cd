#!/bin/bash
# The accelerator benchmark on an NVIDIA GPU under MLX's CUDA build, as one prepared device run.
# Here, first, `bash benchmarks/gpu.sh prepare` fills .gpu/ (add `/.gpu/` to .git/info/exclude;
# carry it): MLX's CUDA wheels (~22 MB, ../shared/gpu), llguidance's wheel (the device image lacks
# it), and the tokenizer and traces the sets read (../shared does not travel). There, from the
# repo root:
#   [SETS="..."] [TRACES=2] [REPEATS=2] [BUDGET=420] bash benchmarks/gpu.sh
# On an H200 a set takes ~100 s at these defaults, ~190 s at 3 traces and 3 rounds, plus ~60 s to
# start: the defaults fit the three sets in one run with room to run again in 15 minutes.
# Writes $OUT/log, $OUT/gpu.jsonl, $OUT/attention_runs.jsonl and the calibrations specgen measured
# there (the curve and the batched-step grid), which decide whether and how far it drafts.
set -o pipefail
if [ "$1" = prepare ]; then
  set -e
  bash ../shared/gpu/make_mlx_cuda.sh .gpu
  py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python  # the installed llguidance's version
  version=$($py -c "import importlib.metadata as m; print(m.version('llguidance'))")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 -d .gpu/whl "llguidance==$version"
  mkdir -p .gpu/shared/tokenizers .gpu/shared/traces
  cp -r ../shared/tokenizers/smollm2 .gpu/shared/tokenizers/
  cp ../shared/traces/{chat_llama2_7b,code_edit_qwen25coder_7b,code_fix_python}.jsonl .gpu/shared/traces/
  exit 0
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPE=${SHAPE:-8b}; DTYPE=${DTYPE:-4bit}
if [ -f .gpu/mlx-cuda.tar.xz ] && [ -z "$NO_BUNDLE" ]; then
  mkdir -p /tmp/site && tar xJf .gpu/mlx-cuda.tar.xz -C /tmp/site || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
[ -e ../shared ] || ln -s "$PWD/.gpu/shared" ../shared
export PYTHONUNBUFFERED=1 SPECGEN_CACHE_DIR=$OUT/cache
(nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv 2>&1 || true) | tee "$OUT/log"
timeout "${BUDGET:-420}" python3 benchmarks/accelerator.py --shape "$SHAPE" --dtype "$DTYPE" \
  --traces "${TRACES:-2}" --max-tokens 128 --repeats "${REPEATS:-2}" --batch 4 --json "$OUT/gpu.jsonl" \
  --sets ${SETS:-chat_llama2_7b code_edit_qwen25coder_7b code_fix_python} 2>&1 | tee -a "$OUT/log"
# What an attention call and a row-slot cost there (design.md "Attention by runs of rows": GROUP).
timeout 90 python3 benchmarks/attention_runs.py --shape "$SHAPE" --dtype "$DTYPE" --rows 2 8 --slots 8192 \
  2>&1 | tee -a "$OUT/log" | grep '^{' > "$OUT/attention_runs.jsonl"
cp "$OUT"/cache/*calibration.json "$OUT/" 2>/dev/null; rm -rf "$OUT/cache"
