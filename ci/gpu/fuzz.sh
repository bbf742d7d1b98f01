#!/usr/bin/env bash
# Issue 10: each fuzz target for 10^7 executions (5 jobs x 2,000,000 runs, 5 workers each),
# in the background on the GPU machine's spare cores. Built here with
# `cargo +nightly fuzz build -O -a -s none` (no sanitizer: faster; Rust's own checks and
# debug assertions stay on). Results (logs, new corpus units, crashes) under $OUT/fuzz.
cd "$(dirname "$0")/../.."
F=$PWD/gpu-bin/fuzz
RUNS=${RUNS:-2000000}
JOBS=${JOBS:-5}
for t in request_parser rest_bodies elf_loader bzimage_loader; do
    mkdir -p "$OUT/fuzz/$t/artifacts" "/tmp/corpus/$t"
    cp -r fuzz/seeds/$t/. "/tmp/corpus/$t/" 2>/dev/null
    (cd "$OUT/fuzz/$t" && "$F/$t" -runs=$RUNS -max_total_time=${SECS:-420} -jobs=$JOBS -workers=$JOBS -max_len=65536 \
        -artifact_prefix="$OUT/fuzz/$t/artifacts/" "/tmp/corpus/$t" > driver.log 2>&1) &
done
wait
for t in request_parser rest_bodies elf_loader bzimage_loader; do
    runs=$(grep -h "^Done [0-9]* runs" "$OUT/fuzz/$t"/fuzz-*.log | awk '{s+=$2} END {print s+0}')
    secs=$(grep -h "^Done [0-9]* runs" "$OUT/fuzz/$t"/fuzz-*.log | awk '{if ($5>m) m=$5} END {print m+0}')
    crashes=$(ls "$OUT/fuzz/$t/artifacts" | wc -l)
    echo "FUZZ $t: $runs executions in ${secs}s (longest job), artifacts: $crashes, corpus: $(ls "/tmp/corpus/$t" | wc -l)"
done
