#!/bin/sh
# Runs every fuzz target for SECONDS (default 600) each, one after the other,
# and prints one summary line per target. Needs a nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`).
set -u
cd "$(dirname "$0")"
seconds=${1:-600}
for target in carrier_env result_line judge_output http_body mcp_json; do
    log="/tmp/kanban-fuzz-$target.log"
    cargo +nightly fuzz run "$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 > "$log" 2>&1
    status=$?
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -n 1)
    echo "$target: exit $status, ${runs:-no summary} in ${seconds}s (log $log)"
done
