"""A worker for a Python host: it claims a card, runs a scripted "model"
whose first turn fails with a retryable error, recovers in place through
``recover_failed_kanban_turns`` with the real lease proof, and completes."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from kanban_core import Board, turn_recovery


def main(board_path: str) -> int:
    board = Board(board_path, create=True)
    task_id = board.add("summarise the release notes")
    claim = board.claim(task_id, ttl_seconds=600)
    assert claim is not None, "the new card is ready"
    os.environ.update(claim.env())  # the carrier, as a dispatcher hands it
    replies = iter(
        [
            {"failed": True, "failure_retryable": True, "failure_reason": "timeout",
             "error": "peer closed connection"},
            {"completed": True, "final_response": "three changes, one fix"},
        ]
    )
    latest: dict[str, Any] = next(replies)

    def turn(nudge: str) -> None:  # the same session, told not to start over
        nonlocal latest
        latest = next(replies)

    attempts = turn_recovery.recover_failed_kanban_turns(
        turn, lambda: latest, sleep_fn=lambda seconds: None, emit=print
    )
    board.complete(claim, latest["final_response"])
    print(f"{board.show(task_id)['task']['status']} after {attempts} recovery")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else f"{folder}/kanban.db"))
