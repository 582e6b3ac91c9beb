"""Typed answers: ``Agent(output_type=T)`` (issue 17; being built)."""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["OutputMode"]

OutputMode: TypeAlias = Literal["auto", "native", "tool", "text"]
"""How a model is asked for a typed answer (see ``Agent``)."""
