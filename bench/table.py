"""What the bench scripts share: the options every one takes, and the table each prints.

A bench is a script that measures and prints a table; tests assert behaviour. Each script builds its parser
with `parser`, which adds the options every bench has (`--json`), describes its columns once as `Column`s,
and prints and saves its rows with `emit`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Column:
    """One column of a bench table."""

    key: str
    """The row's key holding the value."""
    title: str
    """The header."""
    width: int
    """Characters the column takes, header included."""
    fmt: str = ""
    """Format spec of the value (e.g. ".4f", "+.4f"); a None value prints as "-"."""
    left: bool = False
    """Align left (names) rather than right (figures); after another column, one space of its width
    separates it from that column."""

    def cell(self, value: Any, first: bool = False) -> str:
        return self._align("-" if value is None else format(value, self.fmt), first)

    def header(self, first: bool = False) -> str:
        return self._align(self.title, first)

    def _align(self, text: str, first: bool) -> str:
        if not self.left:
            return f"{text:>{self.width}}"
        return f"{text:<{self.width}}" if first else f" {text:<{self.width - 1}}"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the script's docstring's first line, with the common options."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the rows to this JSON file")
    return ap


def render(columns: Sequence[Column], rows: Sequence[dict[str, Any]], detail: str | None = None) -> list[str]:
    """The table's lines: a header, then one line per row (and, with `detail`, that key's value indented
    under it)."""
    lines = ["".join(c.header(i == 0) for i, c in enumerate(columns))]
    for r in rows:
        lines.append("".join(c.cell(r.get(c.key), i == 0) for i, c in enumerate(columns)))
        if detail is not None:
            lines.append(f"  {detail}: {r.get(detail)}")
    return lines


def emit(columns: Sequence[Column], rows: Sequence[dict[str, Any]], json_path: str | None,
         detail: str | None = None) -> None:
    """Print the table on stdout (a bench's output is its table) and write the rows as JSON if asked."""
    print("\n".join(render(columns, rows, detail)))
    if json_path:
        Path(json_path).write_text(json.dumps(list(rows), indent=2))
