#!/bin/sh
# A minimal kanban agent: it reads its turn request (one JSON object on
# stdin), does its "work", makes the terminal board call, and prints its turn
# result as the last JSON line of stdout. See docs/agent-protocol.md.
request=$(cat)
echo "turn $KANBAN_TURN of session $KANBAN_SESSION_ID for task ${HERMES_KANBAN_TASK:-none}" >&2
if [ -n "$HERMES_KANBAN_TASK" ]; then
    "${KANBAN_BIN:-kanban}" comment "example agent at work" >&2 || exit 1
    "${KANBAN_BIN:-kanban}" complete --summary "finished by the example agent" >&2 || exit 1
fi
echo '{"completed": true, "final_response": "the example agent finished its card"}'
