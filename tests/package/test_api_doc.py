"""docs/api.md's "Writing a suite": its example is the file CI runs, and it names every marker and ChaosRun member."""

from __future__ import annotations

import inspect
from pathlib import Path

from diloco_chaos.harness.chaos_run import ChaosRun
from diloco_chaos.harness.testing.pytest_plugin import MARKERS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "suite" / "test_writing_a_suite.py"


def _section() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    start = text.index("## Writing a suite")
    return text[start:text.index("\n## ", start + 1)]


def test_the_docs_example_is_the_file_pytest_runs() -> None:
    section = _section()
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    assert block == EXAMPLE.read_text(), f"docs/api.md's suite example differs from {EXAMPLE}: copy the file in"
    testpaths = (ROOT / "pyproject.toml").read_text()
    assert '"examples/suite"' in testpaths, "pytest's testpaths must include the example so CI runs it"


def test_writing_a_suite_names_every_marker_fixture_and_chaos_run_member() -> None:
    section = _section()
    for name in MARKERS:
        assert f"`{name}`" in section, name
    for fixture in ("run_scenario", "cluster", "toxiproxy"):
        assert f"| `{fixture}` |" in section, fixture
    public = [n for n, _ in inspect.getmembers(ChaosRun) if not n.startswith("_")]
    public += [f for f in ChaosRun.__dataclass_fields__ if not f.startswith("_") and f != "printed"]
    missing = [n for n in set(public) if f"`.{n}" not in section and f".{n}`" not in section and f"`.{n}(" not in
               section]
    assert not missing, f"ChaosRun members not documented in docs/api.md: {sorted(missing)}"
    assert "`dc.scenario_task(sc)" in section and "-m failure" in section
