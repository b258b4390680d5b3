"""The command line of a generated doc (docs/events.md): write it, or with --check say
whether the committed file is still what its registry renders. One implementation for every generator."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def main(doc: Path, render: Callable[[], str], command: str, description: str | None,
         argv: list[str] | None = None) -> int:
    """Write `render()` to `doc` (exit 0), or with --check exit 1 when the committed file differs."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed doc differs, write nothing")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = doc.exists() and doc.read_text() == text
        if not same:
            log.error("%s is out of date: run %s", doc, command)
        return 0 if same else 1
    doc.write_text(text)
    log.info("wrote %s", doc)
    return 0
