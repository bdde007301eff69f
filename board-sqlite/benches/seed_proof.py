"""The seed system's lease proof, `worker_claim_is_live`, transcribed from
../shared/seeds/003_182b96d7b0e27e35.txt for a side-by-side benchmark.

Usage: python3 seed_proof.py DB TASK_ID RUN_ID CLAIM_LOCK ITERATIONS ROUNDS
Prints the best round's microseconds per proof. The transcription keeps the
seed's work per call (the path check, the read-only URI open, the two point
selects, the comparisons) and drops only its logging and environment
fallbacks, which the benchmark does not exercise. verify_pid is False, as in
`prove_lease` with ProofIdentity::AnyProcess.
"""

import sqlite3
import sys
import time
from pathlib import Path


def worker_claim_is_live(*, task_id, db_path, run_id, claim_lock, verify_pid=False):
    if not task_id:
        return False
    if not db_path or not Path(db_path).exists():
        return False
    run_id_env = str(run_id or "").strip()
    lock_env = str(claim_lock or "").strip()
    if not run_id_env or not lock_env:
        return False
    now = int(time.time())
    try:
        conn = sqlite3.connect(f"{Path(db_path).absolute().as_uri()}?mode=ro", uri=True)
        try:
            conn.row_factory = sqlite3.Row
            row = conn.execute(
                "SELECT status, worker_pid, current_run_id, claim_lock, claim_expires "
                "FROM tasks WHERE id = ?",
                (task_id,),
            ).fetchone()
            if row is None:
                return False
            if (row["status"] or "") != "running":
                return False
            worker_pid = row["worker_pid"]
            if verify_pid and worker_pid is not None and int(worker_pid) != 0:
                return False
            current_run_id = row["current_run_id"]
            if current_run_id is None:
                return False
            if str(current_run_id) != run_id_env:
                return False
            if (row["claim_lock"] or "") != lock_env:
                return False
            if row["claim_expires"] is None or int(row["claim_expires"]) < now:
                return False
            run = conn.execute(
                "SELECT ended_at, worker_pid, claim_expires FROM task_runs WHERE id = ?",
                (int(current_run_id),),
            ).fetchone()
            if run is None:
                return False
            if run["ended_at"] is not None:
                return False
            if run["claim_expires"] is None or int(run["claim_expires"]) < now:
                return False
            return True
        finally:
            conn.close()
    except Exception:
        return False


def main():
    db, task_id, run_id, claim_lock, iterations, rounds = sys.argv[1:7]
    iterations, rounds = int(iterations), int(rounds)
    assert worker_claim_is_live(
        task_id=task_id, db_path=db, run_id=run_id, claim_lock=claim_lock
    ), "the claim must be live for the benchmark to mean anything"
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            worker_claim_is_live(
                task_id=task_id, db_path=db, run_id=run_id, claim_lock=claim_lock
            )
        best = min(best, (time.perf_counter() - start) / iterations)
    print(f"{best * 1e6:.3f}")


if __name__ == "__main__":
    main()
