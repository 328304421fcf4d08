"""Plain-text tables for people (the CLI prints them; the library itself only logs)."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Align columns: text left, numbers right. Returns a Markdown-compatible table."""
    cells = [[str(x) for x in header]] + [[str(x) for x in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def is_number(text: str) -> bool:
        return text.replace(".", "", 1).replace("-", "", 1).replace("+", "", 1).replace("x", "", 1).isdigit()

    def line(row: list[str]) -> str:
        parts = [cell.rjust(w) if is_number(cell) else cell.ljust(w) for cell, w in zip(row, widths)]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])
