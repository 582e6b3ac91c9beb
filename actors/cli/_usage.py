"""The usage per agent of a finished tree: a rich table, or aligned plain text.

One row per execution (parents before children, names indented by depth) with what
it used itself: status, steps, tool calls, input and output tokens, cost when any
model was priced, and seconds; a last row with the totals of the whole runtime.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fractor.runtime import TreeSnapshot

from ._draw import STATUS_STYLE, own_steps, tree_order

__all__ = ["print_usage", "usage_lines", "usage_table"]


_COLUMNS = ("agent", "status", "steps", "tool calls", "input tokens", "output tokens")


def _rows(snapshot: TreeSnapshot) -> tuple[list[tuple[str, ...]], tuple[str, ...], bool]:
    """Rows of own usage per execution, the totals row, and whether costs show."""
    steps = own_steps(snapshot)
    priced = any(node.usage.cost for node in snapshot.nodes)
    rows: list[tuple[str, ...]] = []
    total: tuple[str, ...] = ()
    for node in tree_order(snapshot):
        usage = node.own_usage
        if node.parent_id is None:
            usage, name, status = node.usage, "total", ""
            step_count = node.steps
        else:
            name, status = "  " * max(node.depth - 1, 0) + node.name, node.status
            step_count = steps[node.id]
        row = (
            name,
            status,
            f"{step_count}",
            f"{usage.tool_calls}",
            f"{usage.input_tokens:,}",
            f"{usage.output_tokens:,}",
            *((f"{usage.cost:.4f}",) if priced else ()),
            f"{node.seconds:.2f}",
        )
        if node.parent_id is None:
            total = row
        else:
            rows.append(row)
    return rows, total, priced


def usage_table(snapshot: TreeSnapshot, *, title: str | None = "usage per agent") -> Table:
    """A rich table of what each execution used itself, and a totals row."""
    rows, total, priced = _rows(snapshot)
    table = Table(title=title, title_justify="left", show_footer=bool(total))
    columns = (*_COLUMNS, *(("cost",) if priced else ()), "seconds")
    for index, column in enumerate(columns):
        table.add_column(
            column,
            footer=total[index] if total else "",
            justify="left" if index < 2 else "right",
            no_wrap=index < 2,
        )
    for row in rows:
        status = row[1]
        icon, style = STATUS_STYLE.get(status, ("", ""))
        table.add_row(row[0], Text(f"{icon} {status}", style=style), *row[2:])
    return table


def usage_lines(snapshot: TreeSnapshot) -> list[str]:
    """The usage table as aligned plain text lines (for pipes and logs)."""
    rows, total, priced = _rows(snapshot)
    header = (*_COLUMNS, *(("cost",) if priced else ()), "seconds")
    everything = [header, *rows, *((total,) if total else ())]
    widths = [max(len(row[index]) for row in everything) for index in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.ljust(width) if index < 2 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    lines = [line(header), rule, *(line(row) for row in rows)]
    if total:
        lines += [rule, line(total)]
    return lines


def print_usage(
    snapshot: TreeSnapshot, console: Console, *, plain: bool, title: str = "usage per agent"
) -> None:
    """Print the usage of ``snapshot``: a rich table, or aligned plain lines if ``plain``."""
    if plain:
        console.out(f"== {title} ==", highlight=False)
        for line in usage_lines(snapshot):
            console.out(line, highlight=False)
    else:
        console.print(usage_table(snapshot, title=title))
