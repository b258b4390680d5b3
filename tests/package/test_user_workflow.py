"""ci/user-workflow.yml, the workflow a user copies: the install and report steps a new user had to fix by hand;
and ci/explore-nightly.yml, the nightly soak: scheduled, the same install, explore on every scenario file, the
incidents uploaded whatever happened, and the job failing when explore found a failing schedule.

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
NIGHTLY = ROOT / "ci" / "explore-nightly.yml"


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


def workflow(path: Path = WORKFLOW) -> dict[str, Any]:
    doc = read_yaml(path.read_text())
    assert isinstance(doc, dict) and set(doc) >= {"name", "on", "permissions", "env", "jobs"}, doc
    return doc


def steps(path: Path = WORKFLOW) -> list[dict[str, Any]]:
    (job,) = workflow(path)["jobs"].values()
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


def test_the_nightly_soak_is_scheduled_and_installs_as_the_user_workflow_does() -> None:
    doc = workflow(NIGHTLY)
    assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", doc["on"]["schedule"][0]["cron"]), doc["on"]
    assert "workflow_dispatch" in doc["on"], "it can be started by hand"
    for key in ("DILOCO_CHAOS", "TORCH"):
        assert doc["env"][key] == workflow()["env"][key], key
    (install,) = [s for s in steps(NIGHTLY) if "pip install" in s.get("run", "")]
    (user_install,) = [s for s in steps() if "pip install" in s.get("run", "")]
    pips = [c for c in commands(install) if "install" in c]
    assert pips[0] == [c for c in commands(user_install) if "install" in c][0], "torch first, from the CPU index"
    assert "$DILOCO_CHAOS" in pips[1], pips


def _explore_step() -> dict[str, Any]:
    (step,) = [s for s in steps(NIGHTLY) if "diloco-chaos explore" in s.get("run", "")]
    return step


FAKE_EXPLORE = """#!/bin/sh
# stands in for `diloco-chaos explore SCENARIO --budget-s S --out DIR`: exit 1 and a minimal incident for a
# scenario named bad*, exit 0 otherwise; writes explore.jsonl and a report.html as explore does
echo "$@" >> "$CALLS"
out=$6
mkdir -p "$out/runs/shrink-0000/run"
echo '{}' > "$out/explore.jsonl"
case "$2" in */bad*)
  echo '[[faults]]' > "$out/minimal-work_kept.toml"
  echo '<html>' > "$out/runs/shrink-0000/run/report.html"
  exit 1;;
esac
"""


def _run_explore_step(tmp_path: Path, scenarios: list[str]) -> tuple[int, list[str]]:
    import os
    import subprocess

    fake = tmp_path / ".venv" / "bin" / "diloco-chaos"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_EXPLORE)
    fake.chmod(0o755)
    (tmp_path / "scenarios").mkdir()
    for name in scenarios:
        (tmp_path / "scenarios" / f"{name}.toml").write_text("")
    env = {**os.environ, **workflow(NIGHTLY)["env"], "CALLS": str(tmp_path / "calls")}
    done = subprocess.run(["bash", "-e", "-c", _explore_step()["run"]], cwd=tmp_path, env=env, timeout=60)
    return done.returncode, (tmp_path / "calls").read_text().splitlines()


def test_the_explore_step_explores_every_scenario_and_fails_when_one_found_a_failure(tmp_path: Path) -> None:
    rc, calls = _run_explore_step(tmp_path / "clean", ["a", "b"])
    assert rc == 0 and len(calls) == 2, (rc, calls)
    assert (tmp_path / "clean" / "explore-out" / "b" / "explore.jsonl").is_file(), "each scenario has its --out"
    assert calls[0].split() == ["explore", "scenarios/a.toml", "--budget-s", workflow(NIGHTLY)["env"]["BUDGET_S"],
                                "--out", "explore-out/a"], calls
    rc, calls = _run_explore_step(tmp_path / "found", ["a", "bad", "c"])
    assert rc == 1, "a failing schedule fails the job"
    assert [c.split()[1] for c in calls] == ["scenarios/a.toml", "scenarios/bad.toml", "scenarios/c.toml"], \
        "the scenarios after the failing one are explored too"


def test_the_incidents_reports_and_logs_are_uploaded_whatever_the_outcome(tmp_path: Path) -> None:
    (upload,) = [s for s in steps(NIGHTLY) if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()", "the incidents are wanted most when the explore step failed"
    patterns = upload["with"]["path"].split()
    _run_explore_step(tmp_path, ["ok", "bad"])
    written = {p.relative_to(tmp_path).as_posix() for p in (tmp_path / "explore-out").rglob("*") if p.is_file()}
    uploaded = {p.relative_to(tmp_path).as_posix() for pat in patterns for p in tmp_path.glob(pat)}
    assert uploaded == written, written - uploaded
    assert {"explore-out/bad/minimal-work_kept.toml", "explore-out/bad/runs/shrink-0000/run/report.html",
            "explore-out/ok/explore.jsonl"} <= uploaded
    readme = (ROOT / "ci" / "README.md").read_text()
    assert "explore-nightly.yml" in readme and "minimal-" in readme and "exit" in readme
