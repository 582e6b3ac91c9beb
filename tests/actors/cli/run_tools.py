"""Tools that ``fractor run --tool`` loads in the command's tests."""

from __future__ import annotations

from fractor.actors import tool

SENT: list[str] = []
#: The texts ``word_count`` really counted.
COUNTED: list[str] = []


@tool(approval=True)
async def send_note(text: str) -> str:
    """Send a note to the team."""
    SENT.append(text)
    return f"note sent: {text}"


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    COUNTED.append(text)
    return len(text.split())
