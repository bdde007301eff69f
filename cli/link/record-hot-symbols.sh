#!/bin/sh
# Records the functions a quiet worker and its agent's `kanban complete`
# run, alone and under a dispatcher, for the linker to place first (see
# cli/build.rs).
#
#   cargo build --release -p kanban-cli
#   cli/link/record-hot-symbols.sh target/release/kanban > /tmp/release.txt
#   cargo bench -p kanban-cli --no-run
#   cli/link/record-hot-symbols.sh target/release/kanban > /tmp/bench.txt
#   cat /tmp/release.txt /tmp/bench.txt | awk '!seen[$0]++' > cli/link/hot-symbols.txt
#
# Both builds, because the benchmarks' dev-dependencies' features change
# the symbols' hashes; each symbol kept once, in the order first seen.
# Needs valgrind. Prints the symbols, one a line, in the order recorded.
set -eu
kanban=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$kanban" --db board.db init > /dev/null
card=$("$kanban" --db board.db add "a quiet card")
claim=$("$kanban" --db board.db claim "$card" --json)
field() { printf '%s' "$claim" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
cat > agent.sh <<'AGENT'
#!/bin/sh
cat > /dev/null
"$KANBAN_BIN" complete --summary done || exit $?
echo '{"completed": true}'
AGENT
chmod 755 agent.sh
HERMES_KANBAN_TASK=$card HERMES_KANBAN_DB=$(field db) HERMES_KANBAN_RUN_ID=$(field run_id) \
HERMES_KANBAN_CLAIM_LOCK=$(field claim_lock) HERMES_KANBAN_STOP_NUDGE=0 \
    valgrind --quiet --tool=callgrind --demangle=no --trace-children=yes \
    --callgrind-out-file="$work/alone.%p" "$kanban" worker --agent "$work/agent.sh" > /dev/null
"$kanban" --db board.db add "a dispatched card" > /dev/null
HERMES_KANBAN_STOP_NUDGE=0 valgrind --quiet --tool=callgrind --demangle=no --trace-children=yes \
    --callgrind-out-file="$work/dispatched.%p" \
    "$kanban" --db board.db dispatch --until-idle --agent "$work/agent.sh" > /dev/null
nm --defined-only "$kanban" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u > text-symbols
# Functions in the order callgrind names them: the lone worker's and its
# agent's first, then the dispatched ones'.
for calls in $(ls alone.* | sort -t. -k2 -n) $(ls dispatched.* | sort -t. -k2 -n); do
    sed -n 's/^c\{0,1\}fn=([0-9]*) //p' "$calls"
done | awk 'NR == FNR { text[$0] = 1; next } ($0 in text) && !seen[$0]++' text-symbols -
