#!/usr/bin/env bash
# The results matrix (docs/benchmarks.md, "Results matrix"): every scheduling preset on every
# workload at three closed-loop loads (light, ~70 % of the saturated throughput, saturation) with
# profiler annotations, plus the oracle ablation at saturation.  One cell = one `compare` (all
# presets on the identical instance, seed 0, 64-token blocks) -> bench/results/matrix-<workload>-<load>.json.
#
#   bench/matrix.sh                                   # every cell, the eight presets, two cells at a time
#                                                     # (JOBS; each cell runs its presets one by one)
#   PRESETS=clairvoyant SUFFIX=-clairvoyant bench/matrix.sh   # more presets later: run, then merged in
#   ONLY=coding_assistant bench/matrix.sh             # the cells whose name contains this
#   bench/matrix.sh report                            # tables (stdout) and docs/img/matrix-*.png only
#
# Presets run alone give the numbers they give inside a group (the simulator is deterministic and
# `compare` gives each preset its own copy of one warm-up), so the SUFFIX runs merge exactly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
PRESETS=${PRESETS:-vllm-prodstack,sglang-gw,continuum,autellix,kairos,saga,pythia,clairvoyant}
SUFFIX=${SUFFIX:-}
ONLY=${ONLY:-}
OUT=bench/results

# name                         workload          gpus concurrency workflows annotations
CELLS="
coding_assistant-light         coding_assistant   8    64   64   profiler
coding_assistant-mid           coding_assistant   8   256  256   profiler
coding_assistant-sat           coding_assistant   8   384  384   profiler
coding_assistant-sat-oracle    coding_assistant   8   384  384   oracle
swe_agent-light                swe_agent          8     8   12   profiler
swe_agent-mid                  swe_agent          8    20   30   profiler
swe_agent-sat                  swe_agent          8    32   48   profiler
swe_agent-over                 swe_agent          8    48   48   profiler
swe_agent-over-oracle          swe_agent          8    48   48   oracle
kairos_mix-light               kairos_mix         8   128  128   profiler
kairos_mix-mid                 kairos_mix         8   512  512   profiler
kairos_mix-sat                 kairos_mix         8  1024 1024   profiler
deep_research-light            deep_research      8    64   64   profiler
deep_research-mid              deep_research      8   128  128   profiler
deep_research-high             deep_research      8   256  256   profiler
chatdev-light                  chatdev            8    32   48   profiler
chatdev-mid                    chatdev            8    64   96   profiler
chatdev-high                   chatdev            8   128  128   profiler
mcts_lats-light                mcts_lats          1    16   16   profiler
mcts_lats-mid                  mcts_lats          1    32   32   profiler
mcts_lats-high                 mcts_lats          1    64   64   profiler
"

cells() { echo "$CELLS" | awk 'NF == 6' | grep -- "${ONLY}" || true; }

run_cell() {  # name workload gpus concurrency workflows annotations
    local out="$OUT/matrix-$1$SUFFIX.json"
    nice -n 10 "$PY" -m clairvoyant.bench compare --workload "$2" --gpus "$3" --concurrency "$4" \
        --workflows "$5" --annotations "$6" --seed 0 --block-size 64 --policies "$PRESETS" --jobs 1 --out "$out" \
        > "$out.log" 2>&1 && rm -f "$out.log" && echo "done $1 ($out)"
}
export -f run_cell
export PY OUT PRESETS SUFFIX

if [ "${1:-}" != "report" ]; then
    cells | xargs -P "$JOBS" -L 1 bash -c 'run_cell "$@"' _
    if [ -n "$SUFFIX" ]; then
        for name in $(cells | awk '{print $1}'); do
            "$PY" -m clairvoyant.bench merge "$OUT/matrix-$name.json" "$OUT/matrix-$name$SUFFIX.json" \
                --out "$OUT/matrix-$name.json" && rm "$OUT/matrix-$name$SUFFIX.json"
        done
    fi
fi
"$PY" -m clairvoyant.bench matrix-report $(cells | awk -v out="$OUT" '{print out "/matrix-" $1 ".json"}') \
    --plots docs/img
