#!/usr/bin/env bash
# The headline (docs/benchmarks.md, "Headline"): every scheduling preset, each with the cache and
# scaling policies its paper ran it with (--own-stacks, over an L2 host pool and a shared L3), on
# the five workloads at light load, ~70 % load, peak and repeated bursts, 8 H100s, profiler
# annotations; plus Pythia's own testbed (8 A100-80G) and one cell under KV pressure (swe_agent on a
# single 70B replica, --gpus 4, where FCFS thrashes).  One cell = one `compare` (all presets on
# the identical instance, seed 0, 64-token blocks) -> bench/results/headline-<workload>-<load>.json.
#
#   bench/headline.sh                    # every cell, JOBS cells at a time (each runs its presets one by one)
#   ONLY=coding_assistant bench/headline.sh
#   bench/headline.sh report             # tables (stdout) and docs/img/headline-*.png from the files
#
# The loads come from the results matrix's fcfs-rr probes ("Picking the loads"); "peak" starts the
# peak concurrency's workflows at once, "bursts" sends three bursts one period apart.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
PRESETS=${PRESETS:-vllm-prodstack,sglang-gw,continuum,autellix,kairos,saga,thunderagent,pythia,clairvoyant}
ONLY=${ONLY:-}
OUT=${OUT:-bench/results}
STACK="--own-stacks --host-cache auto --l3 memory --block-size 64 --seed 0 --annotations profiler"

# name                          workload          gpu       warm-up  load
CELLS="
coding_assistant-light          coding_assistant  H100-80G  192  --concurrency 64 --workflows 96
coding_assistant-mid            coding_assistant  H100-80G  192  --concurrency 256 --workflows 256
coding_assistant-peak           coding_assistant  H100-80G  192  --concurrency 384 --workflows 384
coding_assistant-bursts         coding_assistant  H100-80G  192  --arrivals cron:period_s=300,batch=128 --workflows 384
deep_research-light             deep_research     H100-80G  192  --concurrency 64 --workflows 96
deep_research-mid               deep_research     H100-80G  192  --concurrency 128 --workflows 128
deep_research-peak              deep_research     H100-80G  192  --concurrency 256 --workflows 256
deep_research-bursts            deep_research     H100-80G  192  --arrivals cron:period_s=300,batch=96 --workflows 288
swe_agent-light                 swe_agent         H100-80G  64   --concurrency 8 --workflows 12
swe_agent-mid                   swe_agent         H100-80G  64   --concurrency 20 --workflows 30
swe_agent-peak                  swe_agent         H100-80G  64   --concurrency 32 --workflows 48
swe_agent-bursts                swe_agent         H100-80G  64   --arrivals cron:period_s=600,batch=16 --workflows 48
swe_agent-kv                    swe_agent         H100-80G  64   --gpus 4 --concurrency 40 --workflows 60
a100-coding_assistant-peak      coding_assistant  A100-80G  192  --concurrency 256 --workflows 256
a100-deep_research-peak         deep_research     A100-80G  192  --concurrency 256 --workflows 256
chatdev-light                   chatdev           H100-80G  64   --concurrency 32 --workflows 48
chatdev-mid                     chatdev           H100-80G  64   --concurrency 64 --workflows 96
chatdev-peak                    chatdev           H100-80G  64   --concurrency 128 --workflows 128
chatdev-bursts                  chatdev           H100-80G  64   --arrivals cron:period_s=300,batch=64 --workflows 192
kairos_mix-light                kairos_mix        H100-80G  64   --concurrency 128 --workflows 192
kairos_mix-mid                  kairos_mix        H100-80G  64   --concurrency 512 --workflows 512
kairos_mix-peak                 kairos_mix        H100-80G  64   --concurrency 1024 --workflows 1024
kairos_mix-bursts               kairos_mix        H100-80G  64   --arrivals cron:period_s=120,batch=256 --workflows 768
"

cells() { echo "$CELLS" | awk 'NF >= 6' | grep -- "${ONLY}" || true; }

run_cell() {  # name workload gpu warm-up load...
    local name=$1 workload=$2 gpu=$3 warmup=$4
    shift 4
    local out="$OUT/headline-$name.json"
    # shellcheck disable=SC2086  # STACK is a list of options
    nice -n 10 "$PY" -m clairvoyant.bench compare --workload "$workload" --gpus 8 --gpu "$gpu" $STACK \
        --warmup-workflows "$warmup" "$@" --policies "$PRESETS" --jobs 1 --out "$out" \
        > "$out.log" 2>&1 && rm -f "$out.log" && echo "done $name ($out)"
}
export -f run_cell
export PY OUT PRESETS STACK

if [ "${1:-}" != "report" ]; then
    cells | xargs -P "$JOBS" -L 1 bash -c 'run_cell "$@"' _
fi
"$PY" -m clairvoyant.bench matrix-report $(cells | awk -v out="$OUT" '{print out "/headline-" $1 ".json"}') \
    --plots docs/img
