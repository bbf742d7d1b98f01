#!/usr/bin/env bash
# The fuzz campaign (docs/hostile.md): every target for RUNS executions in JOBS
# parallel jobs, from the committed seeds. Build first (or pass prebuilt binaries in
# FUZZ_BIN, as on the GPU machine, which has no cargo: ci/gpu/suite.sh fuzz):
#   (cd fuzz && cargo +nightly fuzz build -O -a -s none)
#   ci/fuzz-campaign.sh [JOBS] [RUNS per job] [SECS limit per job]
set -uo pipefail
cd "$(dirname "$0")/.."
F=${FUZZ_BIN:-$PWD/fuzz/target/x86_64-unknown-linux-gnu/release}
JOBS=${1:-$(nproc)}
RUNS=${2:-$((10000000 / JOBS + 1))}
SECS=${3:-3600}
WORK=${FUZZ_WORK:-$(mktemp -d)}
for t in request_parser rest_bodies elf_loader bzimage_loader migration_stream; do
    mkdir -p "$WORK/$t/corpus" "$WORK/$t/artifacts"
    cp -r "fuzz/seeds/$t/." "$WORK/$t/corpus/"
    (cd "$WORK/$t" && "$F/$t" -runs="$RUNS" -max_total_time="$SECS" -jobs="$JOBS" \
        -workers="$JOBS" -max_len=65536 -artifact_prefix="$WORK/$t/artifacts/" corpus \
        > driver.log 2>&1)
    runs=$(grep -h '^Done [0-9]* runs' "$WORK/$t"/fuzz-*.log | awk '{s+=$2} END {print s+0}')
    found=$(ls "$WORK/$t/artifacts" | wc -l)
    echo "FUZZ $t: $runs executions, $found findings (logs and artifacts: $WORK/$t)"
    grep -h -A3 "panicked" "$WORK/$t"/fuzz-*.log | head -8
done
