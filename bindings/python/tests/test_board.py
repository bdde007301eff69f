"""``kanban_core.Board`` on both engines: the worker's calls, fenced."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from kanban_core import (
    Board,
    BoardMissingError,
    CardNotFoundError,
    Claim,
    FencedWriteError,
    RefusedError,
)


@pytest.fixture(params=["sqlite", "postgresql"])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> Board:
    if request.param == "sqlite":
        return Board(str(tmp_path / "kanban.db"), create=True)
    url = os.environ.get("KANBAN_TEST_PG_URL", "")
    assert url, (
        "KANBAN_TEST_PG_URL names an empty PostgreSQL database: "
        "the harness (harness/pytest.rs) makes one"
    )
    return Board(url, create=True)


def test_a_worker_claims_heartbeats_comments_and_completes(board: Board) -> None:
    task_id = board.add("write the notes", body="cover 0.2", priority=3, tenant="acme")
    claim = board.claim(task_id, ttl_seconds=600)
    assert claim is not None
    assert (claim.task_id, claim.db) == (task_id, board.name)
    assert claim.env()["HERMES_KANBAN_TASK"] == task_id
    assert board.prove(claim)
    assert board.claim(task_id) is None, "a running card is not claimed again"
    assert board.heartbeat(claim, "half way") >= claim.claim_expires
    board.comment(claim, "found the old notes")
    board.complete(claim, "notes written", result="notes.md")
    shown = board.show(task_id)
    assert shown["task"]["status"] == "done"
    assert shown["task"]["tenant"] == "acme"
    assert shown["task"]["result"] == "notes.md"
    assert shown["runs"][-1]["outcome"] == "completed"
    assert [c["body"] for c in shown["comments"]] == ["found the old notes"]
    assert task_id in [card["id"] for card in board.list("done")]
    assert not board.prove(claim), "a completed run's claim is dead"


def test_a_write_after_a_reclaim_is_fenced_and_changes_nothing(board: Board) -> None:
    task_id = board.add("contested")
    claim = board.claim(task_id)
    assert claim is not None
    board.reclaim(task_id, "the operator took it back")
    assert not board.prove(claim)
    for write in (
        lambda: board.complete(claim, "too late"),
        lambda: board.block(claim, "too late", "needs_input"),
        lambda: board.heartbeat(claim),
        lambda: board.comment(claim, "too late"),
    ):
        with pytest.raises(FencedWriteError):
            write()
    shown = board.show(task_id)
    assert shown["task"]["status"] == "ready"
    assert shown["comments"] == []
    # The next claim is a new run; the old claim stays dead.
    again = board.claim(task_id)
    assert again is not None and again.run_id > claim.run_id
    assert board.prove(again) and not board.prove(claim)
    board.block(again, "needs the API key", "needs_input")
    assert board.show(task_id)["task"]["status"] == "blocked"


def test_the_claim_matrix_of_the_rust_proof(board: Board) -> None:
    task_id = board.add("proved")
    claim = board.claim(task_id, ttl_seconds=1)
    assert claim is not None
    forged = {
        "live": claim,
        "another lock": Claim(task_id, claim.db, claim.run_id, "forged-lock"),
        "another run": Claim(task_id, claim.db, claim.run_id + 1, claim.claim_lock),
        "another card": Claim("t_00000000", claim.db, claim.run_id, claim.claim_lock),
    }
    assert {name: board.prove(c) for name, c in forged.items()} == {
        "live": True,
        "another lock": False,
        "another run": False,
        "another card": False,
    }
    # The lease lapses: not live, though nothing else changed.
    time.sleep(2.1)
    assert not board.prove(claim)


def test_the_recorded_worker_pid_is_checked_when_asked(tmp_path: Path) -> None:
    board = Board(str(tmp_path / "kanban.db"), create=True)
    task_id = board.add("pinned to a pid")
    claim = board.claim(task_id)
    assert claim is not None
    assert board.prove(claim, verify_pid=True), "no pid recorded: any process"
    with sqlite3.connect(board.name) as conn:
        conn.execute("UPDATE tasks SET worker_pid = 999999999 WHERE id = ?", (task_id,))
    assert board.prove(claim)
    assert not board.prove(claim, verify_pid=True)


def test_bad_input_gets_its_own_error(tmp_path: Path, board: Board) -> None:
    with pytest.raises(BoardMissingError, match="create=True"):
        Board(str(tmp_path / "nowhere.db"))
    assert not (tmp_path / "nowhere.db").exists()
    with pytest.raises(BoardMissingError):
        Board("postgres://kanban@127.0.0.1:1/nothing")
    with pytest.raises(CardNotFoundError):
        board.show("t_ffffffff")
    with pytest.raises(RefusedError):
        board.list("no-such-status")
    task_id = board.add("blocked badly")
    claim = board.claim(task_id)
    assert claim is not None
    with pytest.raises(RefusedError):
        board.block(claim, "why", "no-such-kind")
    assert board.show(task_id)["task"]["status"] == "running"


def test_threads_share_one_board(board: Board) -> None:
    ids = [board.add(f"card {n}") for n in range(8)]
    errors: list[BaseException] = []

    def work(task_id: str) -> None:
        try:
            claim = board.claim(task_id)
            assert claim is not None
            board.heartbeat(claim)
            board.complete(claim, "done by a thread")
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(task_id,)) for task_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [board.show(task_id)["task"]["status"] for task_id in ids] == ["done"] * 8
