"""Every repository path the prose cites exists: in the README, docs/, ci/ and examples/ pages, and in the
docstrings and comments of the code and tests. A path in prose goes stale silently when a module moves; this
test is what notices. Paths with a placeholder (`NAME`, `<run-dir>`, `*`) are patterns, not paths, and skipped."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("diloco_chaos", "docs", "tests", "suites", "bench", "examples", "ci")
EXAMPLES = {"suites/test_x.py", "tests/test_chaos.py"}
"""Paths that stand for a user's files in an example (a test id, a scratch repository's suite), not ours."""
SHORT = re.compile(r"(?<![A-Za-z0-9_./-])((?:harness|trainers|chaos)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")
"""A path inside the package written from its top (docs/architecture.md's picture: `harness/run/supervisor.py`)."""
CITED = re.compile(r"(?<![A-Za-z0-9_./-])((?:" + "|".join(TOPS) + r")/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")


def _cited() -> dict[str, list[str]]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out: dict[str, list[str]] = {}
    for f in files:
        if not f.endswith((".py", ".md", ".toml", ".yml")):
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:  # a binary fixture (tests/config/malformed/binary.toml)
            continue
        for n, line in enumerate(text.splitlines(), 1):
            found = [m.group(1) for m in CITED.finditer(line)]
            found += ["diloco_chaos/" + m.group(1) for m in SHORT.finditer(line)]
            for path in (p.rstrip(".") for p in found):
                if re.search(r"[A-Z]{3,}|[<>*{]", path) or path in EXAMPLES:
                    continue
                out.setdefault(path, []).append(f"{f}:{n}")
    return out


def test_every_cited_path_exists() -> None:
    cited = _cited()
    assert len(cited) > 100, "the pattern finds the paths the prose cites"
    missing = {p: where[:3] for p, where in cited.items() if not (ROOT / p).exists()}
    assert not missing, "cited paths that do not exist (path: where cited):\n" + "\n".join(
        f"  {p}: {', '.join(w)}" for p, w in sorted(missing.items()))
