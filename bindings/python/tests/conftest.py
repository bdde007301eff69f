"""The seed's tests import the module under the seed's name: map that name
to ours, and nothing else. The seed system's own ``agent`` package, when it
is installed (the ambient-board test needs its board code), stays as it is."""

from __future__ import annotations

import sys
import types

import kanban_core.turn_recovery

try:
    import agent
except ImportError:
    agent = types.ModuleType("agent")
    sys.modules["agent"] = agent

agent.kanban_turn_recovery = kanban_core.turn_recovery  # type: ignore[attr-defined]
sys.modules["agent.kanban_turn_recovery"] = kanban_core.turn_recovery
