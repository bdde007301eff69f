"""In-place recovery of a kanban worker's failed turn, decided by kanban-core.

A drop-in for the seed system's ``agent.kanban_turn_recovery``: the same
public names, signatures, defaults and behaviour. Every decision (who is a
worker, the attempt budget, retry authority, the backoff, the nudge, the
read-only lease proof and the check -> sleep -> check -> turn loop) is made
by the Rust core; this module only reads the carrier from ``os.environ`` as
the seed module reads it and hands Python callables to the core's ports.

Two module attributes are read at call time, as the seed module reads them,
so that a test (or a host) may replace them: ``RECOVERY_DELAYS_SECONDS``
(the backoff schedule; whole seconds, a fraction is rounded up) and ``_now``
(the clock of the lease proof).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable, Optional

from . import _native

logger = logging.getLogger(__name__)

#: Recovery attempts when ``HERMES_KANBAN_TURN_RECOVERY`` is unset.
DEFAULT_MAX_RECOVERY_ATTEMPTS: int = _native.DEFAULT_MAX_RECOVERY_ATTEMPTS

#: Backoff before recovery attempt N (1-based). The last entry repeats.
RECOVERY_DELAYS_SECONDS: tuple[float, ...] = tuple(
    float(seconds) for seconds in _native.RECOVERY_DELAYS_SECONDS
)

#: The carrier variables this module reads, under the seed system's names.
_CARRIER = (
    "HERMES_KANBAN_TASK",
    "HERMES_KANBAN_TURN_RECOVERY",
    "HERMES_KANBAN_DB",
    "HERMES_KANBAN_RUN_ID",
    "HERMES_KANBAN_CLAIM_LOCK",
)


def _env() -> dict[str, str]:
    """The carrier as the process has it now."""
    return {name: os.environ[name] for name in _CARRIER if name in os.environ}


def _schedule() -> list[float]:
    return [float(seconds) for seconds in RECOVERY_DELAYS_SECONDS]


def kanban_task_id() -> Optional[str]:
    """The dispatcher-set kanban task id, or ``None`` when this is not a worker run."""
    return _native.resolve_task_id(None, _env())


def kanban_turn_recovery_enabled(task_id: Optional[str] = None) -> bool:
    """On when a worker task id is carried and the attempt budget is non-zero."""
    return _native.recovery_enabled(_env(), task_id)


def max_recovery_attempts() -> int:
    """``HERMES_KANBAN_TURN_RECOVERY`` as an attempt count, clamped to [0, 10].

    Unset or blank: the default; ``0``/``false``/``no``/``off``: 0; anything
    unparseable: the default.
    """
    return _native.max_recovery_attempts(_env())


def recovery_delay_seconds(attempt: int) -> float:
    """Backoff before recovery attempt ``attempt`` (1-based); the last entry repeats."""
    return _native.recovery_delay(attempt, _schedule())


def should_recover_turn(
    result: Any, *, attempt: int, task_id: Optional[str] = None
) -> bool:
    """True when a settled worker turn grants in-place retry authority.

    ``attempt`` is the number of recovery attempts already made. Only a
    failed turn the classifier marked retryable, within budget, not a quota
    or billing wall, not interrupted and not terminally settled, is authority.
    """
    return _native.should_recover(result, attempt, _env(), task_id)


def _now() -> int:
    """Wall-clock seconds: one seam, so a test can move the clock across a backoff."""
    return int(time.time())


def worker_claim_is_live(
    *,
    task_id: Optional[str] = None,
    db_path: Optional[str] = None,
    run_id: Optional[str] = None,
    claim_lock: Optional[str] = None,
    verify_pid: bool = True,
) -> bool:
    """True when this process still owns a live, unexpired run and claim lease.

    Read-only, against the pinned board only (``HERMES_KANBAN_DB``, never a
    board found some other way), and fail-closed: a missing coordinate, a
    missing or unreadable board, a moved run or lock, another process's pid,
    a closed run or an expired (or NULL) lease is ``False``.
    """
    resolved = _native.resolve_task_id(task_id, _env())
    if resolved is None:
        return False
    if db_path is None:
        db = (os.environ.get("HERMES_KANBAN_DB") or "").strip() or None
    else:
        db = db_path.strip() or None
    run = str(
        run_id if run_id is not None else os.environ.get("HERMES_KANBAN_RUN_ID") or ""
    ).strip()
    lock = str(
        claim_lock
        if claim_lock is not None
        else os.environ.get("HERMES_KANBAN_CLAIM_LOCK") or ""
    ).strip()
    # `_now` is looked up here, at call time: a test may replace it.
    live, reason = _native.claim_is_live(
        resolved, db, run, lock, verify_pid, lambda: _now()
    )
    if not live:
        logger.warning("kanban claim check: %s — not retrying in place", reason)
    return live


def build_recovery_nudge(
    result: Any, *, attempt: int, max_attempts: int, task_id: Optional[str] = None
) -> str:
    """The synthetic user turn sent after a failed worker turn: same session,
    do not start over, end with ``kanban_complete`` or ``kanban_block``."""
    return _native.recovery_nudge(result, attempt, max_attempts, _env(), task_id)


def recover_failed_kanban_turns(
    turn_fn: Callable[[str], Any],
    get_result: Callable[[], Any],
    *,
    sleep_fn: Callable[[float], None] = time.sleep,
    emit: Optional[Callable[[str], None]] = None,
    claim_check: Optional[Callable[[], bool]] = None,
    task_id: Optional[str] = None,
) -> int:
    """Retry an authorised kanban worker turn in place; returns the attempts made.

    ``turn_fn(nudge)`` runs one more turn; ``get_result()`` returns the
    latest settled result. Before every attempt, and again after its backoff
    and just before the model is re-entered, the worker proves it still owns
    its live claim (``claim_check``, by default :func:`worker_claim_is_live`).
    The loop is bounded by the budget even when the result never changes.
    An exception from ``turn_fn``, ``get_result``, ``sleep_fn`` or
    ``claim_check`` ends the loop and is raised; one from ``emit`` is logged.
    """
    check = claim_check or worker_claim_is_live

    def say(line: str) -> None:
        logger.warning("%s", line)
        if emit is not None:
            try:
                emit(line)
            except Exception:
                logger.debug("kanban turn-recovery emit failed", exc_info=True)

    schedule = [max(0, math.ceil(seconds)) for seconds in _schedule()]
    return _native.recover(
        turn_fn, get_result, sleep_fn, say, check, _env(), task_id, schedule
    )


__all__ = [
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
