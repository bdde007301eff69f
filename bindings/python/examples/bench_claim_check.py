"""The binding's ``worker_claim_is_live`` against the seed's own, on one board
in one run: the seed's function as ``board-sqlite/benches/seed_proof.py``
transcribes it, and ours through ``kanban_core.turn_recovery`` (the carrier
read from ``os.environ``, the proof by kanban-core). Prints each one's best
round in microseconds per proof and the ratio; the target is at least 10x.

Usage: python examples/bench_claim_check.py [ITERATIONS] [ROUNDS]
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kanban_core import Board, turn_recovery

SEED = Path(__file__).resolve().parents[3] / "board-sqlite" / "benches" / "seed_proof.py"


def best(proof: Callable[[], bool], iterations: int, rounds: int) -> float:
    """The best round's microseconds per proof; every proof must hold."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(iterations):
            if not proof():
                raise SystemExit("a proof of the live claim failed")
        times.append((time.perf_counter() - started) / iterations * 1e6)
    return min(times)


def main(iterations: int, rounds: int) -> None:
    spec = importlib.util.spec_from_file_location("seed_proof", SEED)
    assert spec is not None and spec.loader is not None, f"{SEED} is missing"
    seed: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    with tempfile.TemporaryDirectory() as folder:
        board = Board(f"{folder}/kanban.db", create=True)
        claim = board.claim(board.add("proved"), ttl_seconds=3600)
        assert claim is not None
        os.environ.update(claim.env())

        def theirs() -> bool:
            live: bool = seed.worker_claim_is_live(
                task_id=claim.task_id,
                db_path=claim.db,
                run_id=str(claim.run_id),
                claim_lock=claim.claim_lock,
            )
            return live

        def ours() -> bool:
            return turn_recovery.worker_claim_is_live(verify_pid=False)

        for _ in range(2):  # warm both, then time them in turn
            best(theirs, iterations // 10 or 1, 1)
            best(ours, iterations // 10 or 1, 1)
        seed_us, ours_us = best(theirs, iterations, rounds), best(ours, iterations, rounds)
    print(
        f"worker_claim_is_live: ours {ours_us:.1f} µs, the seed's {seed_us:.1f} µs "
        f"per proof: {seed_us / ours_us:.1f}x faster (target >= 10x)"
    )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3])) if len(sys.argv) > 2 else main(2000, 5)
