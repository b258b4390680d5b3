"""ci/user-workflow.yml, the workflow a user copies: the install and report steps a new user had to fix by hand.

GitHub Actions cannot run here, and PyYAML is not a dependency, so the workflow is read with `read_yaml`, a
parser for the block-style subset it is written in (mappings, lists of mappings, `|` and `>` scalars), and the
essentials are checked on that structure: torch from the CPU wheel index alone and before the harness, pytest
named, `checks: write` for the JUnit report action, the harness from a pinned git ref whose placeholders the
README explains, and the same torch pin as pyproject.toml. ci/README.md says what was run of it locally."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "ci" / "user-workflow.yml"


def _scalar(text: str) -> str:
    text = re.sub(r"\s+#.*$", "", text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def read_yaml(text: str) -> Any:
    """The block-style YAML subset of a workflow file (no anchors, no flow mappings; `[a, b]` stays a string)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    pos = 0

    def indent(ln: str) -> int:
        return len(ln) - len(ln.lstrip(" "))

    def block(min_indent: int, fold: bool) -> str:
        nonlocal pos
        body = []
        while pos < len(lines) and indent(lines[pos]) >= min_indent:
            body.append(lines[pos][min_indent:])
            pos += 1
        return (" " if fold else "\n").join(body) + "\n"

    def node(at: int) -> Any:
        nonlocal pos
        if lines[pos].lstrip().startswith("- "):
            items = []
            while pos < len(lines) and indent(lines[pos]) == at and lines[pos].lstrip().startswith("- "):
                lines[pos] = " " * (at + 2) + lines[pos].lstrip()[2:]  # the item's first key, at its indent
                items.append(node(at + 2))
            return items
        out: dict[str, Any] = {}
        while pos < len(lines) and indent(lines[pos]) == at and not lines[pos].lstrip().startswith("- "):
            key, _, rest = lines[pos].strip().partition(":")
            pos += 1
            rest = _scalar(rest)
            if rest in ("|", ">"):
                out[key] = block(indent(lines[pos]), rest == ">")
            elif rest:
                out[key] = rest
            elif pos < len(lines) and indent(lines[pos]) > at:
                out[key] = node(indent(lines[pos]))
            elif pos < len(lines) and indent(lines[pos]) == at and lines[pos].lstrip().startswith("- "):
                out[key] = node(at)
            else:
                out[key] = None
        return out

    return node(0)


def workflow() -> dict[str, Any]:
    doc = read_yaml(WORKFLOW.read_text())
    assert isinstance(doc, dict) and set(doc) >= {"name", "on", "permissions", "env", "jobs"}, doc
    return doc


def steps() -> list[dict[str, Any]]:
    (job,) = workflow()["jobs"].values()
    return job["steps"]


def commands(step: dict[str, Any]) -> list[list[str]]:
    """Each pip / pytest command of a step's `run`, split as the shell would (variables left as written)."""
    return [shlex.split(ln) for ln in step["run"].splitlines() if re.search(r"\b(pip|pytest)\b", ln)]


def test_the_parser_reads_the_structure_it_is_given() -> None:
    doc = read_yaml("a: 1\nb:\n  c: 'x'  # note\n  d:\n    - name: s\n      run: |\n        one\n        two\n"
                    "    - uses: u\n      with:\n        k: v\ne: >\n  p\n  q\n")
    assert doc == {"a": "1", "b": {"c": "x", "d": [{"name": "s", "run": "one\ntwo\n"},
                                                   {"uses": "u", "with": {"k": "v"}}]}, "e": "p q\n"}


def test_torch_comes_first_from_the_cpu_index_alone_and_matches_the_projects_pin() -> None:
    (install,) = [s for s in steps() if "pip install" in s.get("run", "")]
    assert not [c for s in steps() if "run" in s for c in commands(s) if "--extra-index-url" in c], \
        "with two indexes the resolver may take the CUDA wheel"
    pips = [c for c in commands(install) if "install" in c]
    torch_cmd, harness_cmd = pips[0], pips[1]
    assert "$TORCH" in torch_cmd and torch_cmd[torch_cmd.index("--index-url") + 1] == \
        "https://download.pytorch.org/whl/cpu", torch_cmd
    assert "$DILOCO_CHAOS" in harness_cmd and "--index-url" not in harness_cmd, harness_cmd
    pins = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
            if d.startswith("torch")]
    assert workflow()["env"]["TORCH"] == pins[0] == "torch==2.13.0", (workflow()["env"], pins)


def test_pytest_and_pytest_timeout_are_installed_by_name() -> None:
    (install,) = [s for s in steps() if "pip install" in s.get("run", "")]
    named = {re.split(r"[<>=\[ ]", w)[0] for c in commands(install) for w in c}
    assert {"pytest", "pytest-timeout"} <= named, named


def test_the_harness_comes_from_a_pinned_git_ref_whose_placeholders_the_readme_explains() -> None:
    req = workflow()["env"]["DILOCO_CHAOS"]
    assert re.fullmatch(r"diloco-chaos\[dev\] @ git\+https://github\.com/OWNER/diloco-chaos@REF", req), req
    readme = (ROOT / "ci" / "README.md").read_text()
    for placeholder in ("OWNER", "REF"):
        assert re.search(rf"`{placeholder}`", readme), f"ci/README.md does not explain {placeholder}"
    assert "commit sha" in readme, "ci/README.md does not say to pin a commit"


def test_the_junit_report_can_write_its_check_and_reads_the_file_pytest_writes() -> None:
    perms = workflow()["permissions"]
    assert perms == {"contents": "read", "checks": "write"}, perms
    (report,) = [s for s in steps() if s.get("uses", "").startswith("mikepenz/action-junit-report@")]
    (suites,) = [s for s in steps() if "-m pytest" in s.get("run", "")]
    (cmd,) = commands(suites)
    junit = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
    assert report["with"]["report_paths"] == junit and report["if"] == "always()", report
    assert cmd[:4] == [".venv/bin/python", "-m", "pytest", "$SUITES"], cmd
    keep = next(a for a in cmd if a.startswith("--chaos-keep-failed="))
    plugin = ROOT / "diloco_chaos" / "harness" / "testing" / "pytest_plugin.py"
    assert "--chaos-keep-failed" in plugin.read_text(), keep
