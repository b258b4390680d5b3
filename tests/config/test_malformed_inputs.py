"""Every malformed scenario and incident file in tests/config/malformed/ is refused before anything runs: exit 2,
a message naming the key (each file's first line says which: `# expect: KEY`), and no traceback. So are bad
CLI arguments and a damaged run directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from diloco_chaos.harness import cli

CORPUS = Path(__file__).parent / "malformed"
FILES = sorted(CORPUS.glob("*.toml"))
DEFAULT = str(Path(cli.__file__).parent / "config" / "scenarios" / "default.toml")


def expected(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), path
    return first[len("# expect: "):]


def argv(path: Path) -> list[str]:
    if path.name.startswith("incident-"):
        return ["validate", DEFAULT, "--incident", str(path)]
    return ["validate", str(path)]


def test_the_corpus_is_large() -> None:
    assert len(FILES) >= 60


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_malformed_file_exits_2_naming_its_key(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(argv(path))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expected(path) in err, err
    assert "Traceback" not in err


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The command line in this process (argparse's refusals included): its exit code and stderr. An uncaught
    exception fails the test here, where a real process would print a traceback; `test_as_a_real_process_too`
    takes one case of each kind through a real process."""
    try:
        rc = cli.main(list(args))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", ["binary", "random-faults-explodes", "random-faults-topology-huge",
                                  "incident-fault-typo"])
def test_as_a_real_process_too(name: str) -> None:
    """A few of the corpus through the installed command line: the exit code and stderr a user sees."""
    res = run_cli(*argv(CORPUS / f"{name}.toml"))
    assert res.returncode == 2, res.stderr
    assert expected(CORPUS / f"{name}.toml") in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args, key", [
    (["toxiproxy-server", "--port", "x"], "--port"),
    (["report", "/nonexistent/run"], "/nonexistent/run"),
])
def test_bad_arguments_as_a_real_process_too(args: list[str], key: str) -> None:
    res = run_cli(*args)
    assert res.returncode == 2, res.stderr
    assert key in res.stderr and "Traceback" not in res.stderr


def test_validate_reports_every_file_and_passes_good_ones(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["validate", DEFAULT, str(CORPUS / "name-slash.toml"), str(CORPUS / "learners-zero.toml")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "default.toml: OK" in out
    assert "name-slash.toml: invalid" in err and "learners-zero.toml: invalid" in err
    assert cli.main(["validate", DEFAULT]) == 0


@pytest.mark.parametrize("args, key", [
    (["run", "--builtin", "nope", "--quiet"], "no built-in scenario 'nope'"),
    (["toxiproxy-server", "--port", "70000"], "--port"),
    (["toxiproxy-server", "--port", "x"], "--port"),
    (["validate"], "FILE"),
])
def test_bad_arguments_exit_2_without_a_traceback(args: list[str], key: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run_main(capsys, *args)
    assert rc == 2, err
    assert key in err


def test_a_runs_dir_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("")
    rc, err = run_main(capsys, "run", "--runs-dir", str(tmp_path / "afile"), "--quiet")
    assert rc == 2 and "--runs-dir" in err


@pytest.mark.parametrize("config", [b'{"bad', b"[1, 2]", b"\xff\xfe", b""])
def test_a_damaged_run_directory_is_refused_by_replay(tmp_path: Path, config: bytes,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_bytes(config)
    (tmp_path / "events.jsonl").write_text('{"ev": "run_start"')
    rc, err = run_main(capsys, "replay", str(tmp_path), "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert rc == 2, err
    assert "config.json" in err


@pytest.mark.parametrize("report, events, names", [
    (None, b'{"ev": "run_start", "t": 1}\n', "report.json"),
    (b'{"x":', b'{"ev": "run_start", "t": 1}\n', "report.json"),
    (b"[]", b'{"ev": "run_start", "t": 1}\n', "report.json"),
    (b'{"a": 1}', b"garbage\n", "line 1 is not JSON"),
    (b'{"a": 1}', b'{"t": 1}\n', "line 1 is not an event"),
    (b'{"a": 1}', b"", "holds no event"),
])
def test_a_damaged_run_directory_is_refused_by_report(tmp_path: Path, report: bytes | None, events: bytes,
                                                      names: str, capsys: pytest.CaptureFixture[str]) -> None:
    if report is not None:
        (tmp_path / "report.json").write_bytes(report)
    (tmp_path / "events.jsonl").write_bytes(events)
    rc, err = run_main(capsys, "report", str(tmp_path))
    assert rc == 2, err
    assert names in err


INCIDENTS = [p for p in FILES if p.name.startswith("incident-")]


@pytest.mark.parametrize("path", INCIDENTS, ids=[p.stem for p in INCIDENTS])
def test_an_incident_files_error_names_the_incident_file(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv(path)) == 2
    err = capsys.readouterr().err
    assert path.name in err, err


def test_an_incident_typo_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(INCIDENTS) >= 8
    assert cli.main(argv(CORPUS / "incident-fault-typo.toml")) == 2
    err = capsys.readouterr().err
    assert "faults[0].latency" in err and "did you mean latency_ms" in err, err
