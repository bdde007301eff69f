"""Twins of the seed's unit-contract tests of ``agent.kanban_turn_recovery``,
with the seed's names, parameters and assertions, run against our module
under the seed's name (``conftest.py``). The exit-mapping test pins the
seed system's own CLI and has no twin here."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from agent.kanban_turn_recovery import (
    DEFAULT_MAX_RECOVERY_ATTEMPTS,
    RECOVERY_DELAYS_SECONDS,
    build_recovery_nudge,
    kanban_task_id,
    kanban_turn_recovery_enabled,
    max_recovery_attempts,
    recover_failed_kanban_turns,
    recovery_delay_seconds,
    should_recover_turn,
    worker_claim_is_live,
)

KANBAN_ENV = (
    "HERMES_KANBAN_TASK",
    "HERMES_KANBAN_GOAL_MODE",
    "HERMES_KANBAN_TURN_RECOVERY",
    "HERMES_KANBAN_RUN_ID",
    "HERMES_KANBAN_CLAIM_LOCK",
    "HERMES_KANBAN_DB",
    "HERMES_KANBAN_BOARD",
)

#: Any "live" lease for these tests (2100-01-01 UTC).
_FAR_FUTURE_EXPIRY = 4_102_444_800


@pytest.fixture
def clear_kanban_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in KANBAN_ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _failed(
    *, retryable: bool = True, reason: str = "timeout", error: str = "peer closed connection"
) -> dict[str, Any]:
    return {
        "failed": True,
        "failure_retryable": retryable,
        "failure_reason": reason,
        "error": error,
        "final_response": f"API call failed after 3 retries: {error}",
        "completed": False,
        "messages": [],
    }


def _success() -> dict[str, Any]:
    return {"failed": False, "completed": True, "final_response": "done", "messages": []}


def _interrupted() -> dict[str, Any]:
    return {**_failed(), "interrupted": True, "api_calls": 4}


def _settled() -> dict[str, Any]:
    return {**_failed(retryable=True), "turn_exit_reason": "max_iterations_reached(60/60)"}


def _partial() -> dict[str, Any]:
    return {
        "partial": True,
        "completed": False,
        "final_response": "cut off",
        "error": "truncated",
        "messages": [],
    }


# ── enablement / budget ──────────────────────────────────────────────


def test_disabled_without_kanban_task(clear_kanban_env: pytest.MonkeyPatch) -> None:
    assert kanban_task_id() is None
    assert kanban_turn_recovery_enabled() is False
    calls: list[str] = []
    attempts = recover_failed_kanban_turns(
        lambda nudge: calls.append(nudge), lambda: _failed(), sleep_fn=lambda s: None
    )
    assert attempts == 0
    assert calls == []


def test_env_zero_disables_and_blank_ids_are_not_workers(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "0")
    assert kanban_turn_recovery_enabled() is False
    assert should_recover_turn(_failed(), attempt=0) is False
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "   ")
    assert kanban_task_id() is None
    assert kanban_turn_recovery_enabled() is False
    clear_kanban_env.delenv("HERMES_KANBAN_TURN_RECOVERY", raising=False)
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "  t_probe  ")
    assert kanban_task_id() == "t_probe"
    assert kanban_turn_recovery_enabled() is True


def test_max_attempts_parsing_and_clamp(clear_kanban_env: pytest.MonkeyPatch) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    assert max_recovery_attempts() == DEFAULT_MAX_RECOVERY_ATTEMPTS
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "2")
    assert max_recovery_attempts() == 2
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "99")
    assert max_recovery_attempts() == 10
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "abc")
    assert max_recovery_attempts() == DEFAULT_MAX_RECOVERY_ATTEMPTS
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "false")
    assert max_recovery_attempts() == 0


def test_delay_schedule_repeats_last_entry() -> None:
    assert RECOVERY_DELAYS_SECONDS == (15.0, 45.0, 90.0)
    assert recovery_delay_seconds(1) == 15.0
    assert recovery_delay_seconds(3) == 90.0
    assert recovery_delay_seconds(9) == 90.0
    assert recovery_delay_seconds(0) == 15.0


# ── retry authority ──────────────────────────────────────────────────


def test_retryable_failed_turn_is_eligible(clear_kanban_env: pytest.MonkeyPatch) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    assert should_recover_turn(_failed(reason="timeout"), attempt=0) is True
    assert should_recover_turn(_failed(reason="timeout"), attempt=2) is True
    assert should_recover_turn(_failed(reason="timeout"), attempt=3) is False


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(_failed(retryable=False, reason="auth"), id="not-retryable"),
        pytest.param(_success(), id="success"),
        pytest.param(None, id="nothing-settled"),
        pytest.param(_failed(reason="rate_limit"), id="quota-wall"),
        pytest.param(_failed(reason="billing"), id="billing-wall"),
        pytest.param(_failed(reason="upstream_rate_limit"), id="upstream-quota-wall"),
        pytest.param(_interrupted(), id="interrupt"),
        pytest.param(_settled(), id="terminal-settlement"),
        pytest.param(_partial(), id="unfinished-nonfailed"),
        pytest.param({"completed": False, "final_response": "x"}, id="completed-false"),
    ],
)
def test_should_recover_turn_refuses(
    result: Any, clear_kanban_env: pytest.MonkeyPatch
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    assert should_recover_turn(result, attempt=0) is False


# ── live run/claim proof ─────────────────────────────────────────────


def _make_board(
    tmp_path: Path,
    *,
    status: str = "running",
    task_pid: Optional[int] = None,
    run_id: Optional[int] = 1,
    lock: str = "lk",
    run_ended: Optional[int] = None,
    run_pid: Optional[int] = None,
    task_expires: Optional[int] = _FAR_FUTURE_EXPIRY,
    run_expires: Optional[int] = _FAR_FUTURE_EXPIRY,
) -> Path:
    db = tmp_path / "kanban.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT, worker_pid INTEGER,"
        " current_run_id INTEGER, claim_lock TEXT, claim_expires INTEGER);"
        "CREATE TABLE task_runs (id INTEGER PRIMARY KEY, ended_at INTEGER,"
        " worker_pid INTEGER, claim_expires INTEGER);"
    )
    conn.execute(
        "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)",
        ("t_live", status, task_pid, run_id, lock, task_expires),
    )
    if run_id is not None:
        conn.execute(
            "INSERT INTO task_runs VALUES (?, ?, ?, ?)",
            (run_id, run_ended, run_pid, run_expires),
        )
    conn.commit()
    conn.close()
    return db


def _pin_carrier(
    monkeypatch: pytest.MonkeyPatch,
    db: Path,
    *,
    task: str = "t_live",
    run_id: str = "1",
    lock: str = "lk",
) -> None:
    monkeypatch.setenv("HERMES_KANBAN_TASK", task)
    monkeypatch.setenv("HERMES_KANBAN_DB", str(db))
    monkeypatch.setenv("HERMES_KANBAN_RUN_ID", run_id)
    monkeypatch.setenv("HERMES_KANBAN_CLAIM_LOCK", lock)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="owned-live"),
        pytest.param({"status": "ready"}, id="released-to-the-board"),
        pytest.param({"task_pid": 999_999_999}, id="other-process-owns-the-claim"),
        pytest.param({"run_ended": 12345}, id="run-already-closed"),
        pytest.param({"run_pid": 999_999_999}, id="run-handed-to-another-pid"),
        pytest.param({"run_id": None}, id="no-live-run-pointer"),
        pytest.param({"run_id": 2}, id="board-moved-to-another-run"),
        pytest.param({"lock": "other-lock"}, id="claim-lock-no-longer-ours"),
        pytest.param({"task_expires": 1}, id="task-lease-expired"),
        pytest.param({"run_expires": 1}, id="run-lease-expired"),
        pytest.param({"task_expires": None}, id="null-task-lease-is-not-unbounded"),
        pytest.param({"run_expires": None}, id="null-run-lease-is-not-unbounded"),
    ],
)
def test_claim_ownership_matrix(
    clear_kanban_env: pytest.MonkeyPatch, tmp_path: Path, overrides: dict[str, Any]
) -> None:
    board = {"task_pid": os.getpid(), "run_pid": os.getpid(), **overrides}
    db = _make_board(tmp_path, **board)
    _pin_carrier(clear_kanban_env, db)
    assert worker_claim_is_live() is (overrides == {})


def test_claim_check_fails_closed_without_a_board(
    clear_kanban_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_live")
    clear_kanban_env.setenv("HERMES_KANBAN_DB", str(tmp_path / "missing.db"))
    assert worker_claim_is_live() is False
    clear_kanban_env.delenv("HERMES_KANBAN_DB", raising=False)
    clear_kanban_env.setenv("HERMES_KANBAN_BOARD", "no-such-board-xyz")
    assert worker_claim_is_live() is False


def test_missing_pinned_carrier_fails_closed(
    clear_kanban_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = _make_board(tmp_path)
    _pin_carrier(clear_kanban_env, db)
    assert worker_claim_is_live() is True
    for missing, value in (
        ("HERMES_KANBAN_DB", str(db)),
        ("HERMES_KANBAN_RUN_ID", "1"),
        ("HERMES_KANBAN_CLAIM_LOCK", "lk"),
    ):
        clear_kanban_env.delenv(missing, raising=False)
        assert worker_claim_is_live() is False, missing
        clear_kanban_env.setenv(missing, value)


def test_missing_db_pin_never_resolves_an_ambient_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pins gone the seed system's resolver is never consulted, even
    where it would return a fully live board whose row matches this worker
    (made with the seed system's own board code, `hermes-agent==0.19.0`,
    installed in the test venv)."""
    if os.environ.get("KANBAN_SEED_INSTALLED") == "1":
        from hermes_cli import kanban_db as kb
    else:
        kb = pytest.importorskip(
            "hermes_cli.kanban_db",
            reason="the seed system's board code (pip install hermes-agent==0.19.0) "
            "is not in this venv: the package registry could not be reached",
        )
    home = tmp_path / ".hermes"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    for var in KANBAN_ENV:
        monkeypatch.delenv(var, raising=False)
    kb.init_db()
    with kb.connect_closing() as conn:
        task_id = kb.create_task(conn, title="ambient live task")
        assert kb.claim_task(conn, task_id, claimer="lk", ttl_seconds=3600) is not None
    monkeypatch.delenv("HERMES_KANBAN_DB", raising=False)
    monkeypatch.delenv("HERMES_KANBAN_RUN_ID", raising=False)
    monkeypatch.delenv("HERMES_KANBAN_CLAIM_LOCK", raising=False)
    monkeypatch.setenv("HERMES_KANBAN_TASK", task_id)
    import agent.kanban_turn_recovery as rec

    consulted: list[Any] = []
    real_resolve = kb.kanban_db_path

    def _spy(board: Any = None) -> Any:
        consulted.append(board)
        return real_resolve(board=board)

    monkeypatch.setattr(kb, "kanban_db_path", _spy)
    assert rec.worker_claim_is_live() is False
    assert consulted == []
    # With the pins its dispatcher would give, the same board proves live
    # (for any process: its worker pid is not this one).
    conn = sqlite3.connect(home / "kanban.db")
    run_id, lock = conn.execute(
        "SELECT current_run_id, claim_lock FROM tasks WHERE id = ?", (task_id,)
    ).fetchone()
    conn.close()
    monkeypatch.setenv("HERMES_KANBAN_DB", str(home / "kanban.db"))
    monkeypatch.setenv("HERMES_KANBAN_RUN_ID", str(run_id))
    monkeypatch.setenv("HERMES_KANBAN_CLAIM_LOCK", lock)
    assert rec.worker_claim_is_live(verify_pid=False) is True


def test_lease_expired_during_the_backoff_blocks_model_reentry(
    clear_kanban_env: pytest.MonkeyPatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent.kanban_turn_recovery as rec

    db = _make_board(tmp_path, task_expires=1_600, run_expires=1_600)
    _pin_carrier(clear_kanban_env, db, run_id="1", lock="lk")
    clock = iter([1_000, 1_700])
    monkeypatch.setattr(rec, "_now", lambda: next(clock))
    turns: list[str] = []
    emitted: list[str] = []
    attempts = rec.recover_failed_kanban_turns(
        lambda nudge: turns.append(nudge),
        lambda: _failed(),
        sleep_fn=lambda s: None,
        emit=emitted.append,
    )
    assert attempts == 1
    assert turns == []
    assert "no longer holds a live run/claim" in emitted[-1]


# ── the loop ─────────────────────────────────────────────────────────


def _loop_ok(result: Any = None) -> Any:
    return (lambda: True) if result is None else result


def test_recovery_loop_retries_until_success_and_reports(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    latest = {"r": _failed()}
    turns: list[str] = []
    delays: list[float] = []
    emitted: list[str] = []

    def turn_fn(nudge: str) -> None:
        turns.append(nudge)
        latest["r"] = _success()

    attempts = recover_failed_kanban_turns(
        turn_fn,
        lambda: latest["r"],
        sleep_fn=delays.append,
        emit=emitted.append,
        claim_check=_loop_ok(),
    )
    assert attempts == 1
    assert delays == [15.0]
    assert "Do NOT start over" in turns[0]
    assert "t_probe" in turns[0]
    assert len(emitted) == 1
    assert "[kanban]" in emitted[0] and "attempt 1/3" in emitted[0]


def test_recovery_loop_bounded_when_result_never_changes(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    delays: list[float] = []
    attempts = recover_failed_kanban_turns(
        lambda nudge: None,
        lambda: _failed(),
        sleep_fn=delays.append,
        emit=lambda m: None,
        claim_check=_loop_ok(),
    )
    assert attempts == DEFAULT_MAX_RECOVERY_ATTEMPTS
    assert delays == [15.0, 45.0, 90.0]


def test_recovery_loop_order_is_check_sleep_check_turn(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    clear_kanban_env.setenv("HERMES_KANBAN_TURN_RECOVERY", "3")
    events: list[str] = []
    latest = {"r": _failed()}
    proofs = {"n": 0}

    def claim_check() -> bool:
        proofs["n"] += 1
        events.append("check")
        return proofs["n"] == 1

    def turn_fn(nudge: str) -> None:
        events.append("turn")
        latest["r"] = _success()

    attempts = recover_failed_kanban_turns(
        turn_fn,
        lambda: latest["r"],
        sleep_fn=lambda s: events.append("sleep"),
        emit=lambda m: None,
        claim_check=claim_check,
    )
    assert events == ["check", "sleep", "check"]
    assert attempts == 1
    events.clear()
    latest["r"] = _failed()
    attempts = recover_failed_kanban_turns(
        turn_fn,
        lambda: latest["r"],
        sleep_fn=lambda s: events.append("sleep"),
        emit=lambda m: None,
        claim_check=lambda: (events.append("check"), True)[1],
    )
    assert attempts == 1
    assert events == ["check", "sleep", "check", "turn"]


def test_nudge_terminal_contract(clear_kanban_env: pytest.MonkeyPatch) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    nudge = build_recovery_nudge(
        _failed(error="peer closed connection"), attempt=1, max_attempts=3
    )
    assert "t_probe" in nudge
    assert "1/3" in nudge
    assert "kanban_complete" in nudge
    assert "kanban_block" in nudge
    assert "Do NOT start over" in nudge
    assert "peer closed connection" in nudge


def test_explicit_blank_carrier_never_falls_back_to_the_env_pin(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_foreign")
    assert should_recover_turn(_failed(), attempt=0, task_id="   ") is False
    assert should_recover_turn(_failed(), attempt=0, task_id="  t_bound  ") is True


# ── beyond the seed's: what the adaptation must not lose ─────────────


def test_exceptions_of_the_hosts_callables_end_the_loop_and_are_raised(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    calls: list[str] = []

    def turn_fn(nudge: str) -> None:
        calls.append("turn")
        raise RuntimeError("the model host fell over")

    with pytest.raises(RuntimeError, match="fell over"):
        recover_failed_kanban_turns(
            turn_fn, lambda: _failed(), sleep_fn=lambda s: None, claim_check=lambda: True
        )
    assert calls == ["turn"]

    def emit(line: str) -> None:
        raise ValueError("a broken emitter is only logged")

    assert (
        recover_failed_kanban_turns(
            lambda nudge: None,
            lambda: _failed(),
            sleep_fn=lambda s: None,
            emit=emit,
            claim_check=lambda: True,
        )
        == 3
    )


def test_a_result_that_is_not_a_dict_is_not_authority(
    clear_kanban_env: pytest.MonkeyPatch,
) -> None:
    clear_kanban_env.setenv("HERMES_KANBAN_TASK", "t_probe")
    for result in (["failed"], "failed", 1, object(), {"failed": 1, "failure_retryable": True}):
        assert should_recover_turn(result, attempt=0) is False, result
    assert "provider stream failure" in build_recovery_nudge(object(), attempt=1, max_attempts=3)


def test_the_module_is_the_seeds_drop_in() -> None:
    import agent.kanban_turn_recovery as rec

    assert sys.modules["agent.kanban_turn_recovery"].__name__ == "kanban_core.turn_recovery"
    assert sorted(rec.__all__) == sorted(
        [
            "DEFAULT_MAX_RECOVERY_ATTEMPTS",
            "RECOVERY_DELAYS_SECONDS",
            "build_recovery_nudge",
            "kanban_task_id",
            "kanban_turn_recovery_enabled",
            "max_recovery_attempts",
            "recover_failed_kanban_turns",
            "recovery_delay_seconds",
            "should_recover_turn",
            "worker_claim_is_live",
        ]
    )
