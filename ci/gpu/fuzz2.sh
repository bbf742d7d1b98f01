#!/usr/bin/env bash
# Issue 10, second campaign: request_parser after the launch-block overflow fix (10.5M
# executions), then the two loaders for SECS more each, all jobs in parallel.
cd "$(dirname "$0")/../.."
F=$PWD/gpu-bin/fuzz
run() { # target jobs runs secs
    mkdir -p "/tmp/f/$1/corpus" "/tmp/f/$1/art" && cp -r fuzz/seeds/$1/. "/tmp/f/$1/corpus/"
    (cd /tmp/f/$1 && "$F/$1" -runs=$3 -max_total_time=$4 -jobs=$2 -workers=$2 -max_len=65536 \
        -artifact_prefix=/tmp/f/$1/art/ corpus > driver.log 2>&1)
    echo "FUZZ $1: $(grep -h '^Done [0-9]* runs' /tmp/f/$1/fuzz-*.log | awk '{s+=$2} END {print s+0}') executions, \
$(grep -h '^Done' /tmp/f/$1/fuzz-*.log | awk '{if ($5>m) m=$5} END {print m+0}') s, artifacts: $(ls /tmp/f/$1/art | wc -l)"
    grep -h -A3 "panicked" /tmp/f/$1/fuzz-*.log | head -8
}
run request_parser 14 750000 200
run elf_loader 7 100000000 ${SECS:-150} &
run bzimage_loader 7 100000000 ${SECS:-150} &
wait
