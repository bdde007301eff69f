#!/bin/sh
# A kanban agent whose first turn dies on a provider stream reset (a
# retryable failure); the worker retries it in place, in the same session, and
# the second turn finishes the card.
request=$(cat)
if [ "$KANBAN_TURN" = "1" ]; then
    echo "provider stream reset; giving up this turn" >&2
    echo '{"failed": true, "failure_retryable": true, "failure_reason": "timeout", "error": "peer closed connection"}'
    exit 0
fi
case "$request" in
    *'"kind":"recovery"'*) echo "recovery turn: picking up where the stream died" >&2 ;;
esac
"${KANBAN_BIN:-kanban}" complete --summary "finished after an in-place recovery" >&2 || exit 1
echo '{"completed": true, "final_response": "recovered in place and finished"}'
