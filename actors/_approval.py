"""Tool calls a person approves first (issue 17; being built)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TypeAlias

from ._messages import ToolCall

__all__ = ["ApprovalPolicy"]

ApprovalPolicy: TypeAlias = Callable[[ToolCall], bool] | Collection[str]
"""Which tool calls of an agent need approval: tool names, or a function of the call."""
