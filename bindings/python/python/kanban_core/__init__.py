"""kanban's core for Python hosts.

- :mod:`kanban_core.turn_recovery`: a drop-in for the seed system's
  ``agent.kanban_turn_recovery``, every decision made by kanban-core.
- :class:`Board`: a kanban board on SQLite (a file) or PostgreSQL (a
  ``postgres://`` URL), fenced as the ``kanban`` command fences it.
"""

from __future__ import annotations

import builtins
import json
from typing import Any, Optional

from . import _native
from ._native import (
    BoardMissingError,
    CardNotFoundError,
    Claim,
    FencedWriteError,
    KanbanError,
    RefusedError,
    StorageError,
)

__all__ = [
    "Board",
    "BoardMissingError",
    "CardNotFoundError",
    "Claim",
    "FencedWriteError",
    "KanbanError",
    "RefusedError",
    "StorageError",
]


class Board:
    """A kanban board: a SQLite file, or a PostgreSQL database by its URL.

    Every write a worker makes with its :class:`Claim` is fenced: it commits
    only while the claim is live (its run current, its lock, its lease
    unexpired), and otherwise raises :class:`FencedWriteError` and changes
    nothing. Calls release the interpreter while the board works, so the
    host's threads may share one board.
    """

    def __init__(self, path_or_url: str, *, create: bool = False) -> None:
        """Opens the board; ``create=True`` makes it when it is not there.

        A PostgreSQL URL carries no password: it comes from ``PGPASSWORD``
        or the password file. Raises :class:`BoardMissingError` when there
        is no usable board.
        """
        self._board = _native.Board(path_or_url, create=create)

    @property
    def name(self) -> str:
        """The file's canonical path, or the URL without a password."""
        return self._board.name

    def add(
        self,
        title: str,
        *,
        body: Optional[str] = None,
        assignee: Optional[str] = None,
        priority: int = 0,
        parents: Optional[builtins.list[str]] = None,
        tenant: Optional[str] = None,
        created_by: Optional[str] = None,
    ) -> str:
        """Adds a card (ready, or todo while a parent is open); its id."""
        return self._board.add(
            title,
            body=body,
            assignee=assignee,
            priority=priority,
            parents=parents,
            tenant=tenant,
            created_by=created_by,
        )

    def claim(self, task_id: str, *, ttl_seconds: int = 900) -> Optional[Claim]:
        """Claims a ready card under a lease of ``ttl_seconds``; ``None`` when it is not ready."""
        return self._board.claim(task_id, ttl_seconds=ttl_seconds)

    def heartbeat(self, claim: Claim, note: Optional[str] = None) -> int:
        """Renews the lease; its new end (epoch seconds). Fenced."""
        return self._board.heartbeat(claim, note)

    def complete(self, claim: Claim, summary: str, result: Optional[str] = None) -> None:
        """Completes the card and closes the run. Fenced."""
        self._board.complete(claim, summary, result)

    def block(self, claim: Claim, reason: str, kind: Optional[str] = None) -> None:
        """Blocks the card for a human (``kind``: dependency, needs_input,
        capability or transient). Fenced."""
        self._board.block(claim, reason, kind)

    def comment(self, claim: Claim, text: str, author: str = "worker") -> None:
        """Comments on the claimed card. Fenced."""
        self._board.comment(claim, text, author)

    def prove(self, claim: Claim, *, verify_pid: bool = False) -> bool:
        """Whether the claim is live (with ``verify_pid``, held by this process)."""
        return self._board.prove(claim, verify_pid=verify_pid)

    def reclaim(self, task_id: str, reason: str = "reclaimed by the host") -> None:
        """Takes a running card back from its worker: its claim is dead."""
        self._board.reclaim(task_id, reason)

    def show(self, task_id: str) -> dict[str, Any]:
        """The card (``task``), its ``runs``, ``events``, ``comments`` and links."""
        shown: dict[str, Any] = json.loads(self._board.show_json(task_id))
        return shown

    def list(self, status: Optional[str] = None) -> builtins.list[dict[str, Any]]:
        """The cards (of one status), oldest first."""
        listed: builtins.list[dict[str, Any]] = json.loads(self._board.list_json(status))
        return listed

    def __repr__(self) -> str:
        return f"Board({self.name!r})"
