"""The installed distribution adds one top-level name: `diloco_chaos` (with `diloco_chaos.harness`,
`diloco_chaos.trainers`, `diloco_chaos.chaos` inside it) and its dist-info, nothing that could clash with a user's
own `harness/`, `trainers/` or `chaos/` folders. Built as a user would (`pip wheel`), installed into a fresh venv
without its dependencies (they are other distributions' files), and site-packages compared before and after."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _site_packages(venv: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True,
                         timeout=60)
    return Path(out.stdout.strip())


@pytest.mark.timeout(600)
def test_wheel_installs_only_diloco_chaos(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                   check=True, timeout=300, capture_output=True)
    wheel = next(dist.glob("diloco_chaos-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"diloco_chaos"}, tops
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = _site_packages(venv)
    before = {p.name for p in site.iterdir()}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    added = {p.name for p in site.iterdir()} - before
    assert {a for a in added if not a.endswith(".dist-info")} == {"diloco_chaos"}, added
    assert [a for a in added if a.endswith(".dist-info")] == [wheel.name.split("-py3")[0] + ".dist-info"], added
    pkg = site / "diloco_chaos"
    for sub in ("harness", "trainers", "chaos"):
        assert (pkg / sub / "__init__.py").is_file(), f"diloco_chaos.{sub} missing from the wheel"
    scenarios = pkg / "harness" / "config" / "scenarios"
    assert (scenarios / "default.toml").is_file(), "the built-in scenarios are package data"
    assert (scenarios / "fault-free.toml").is_file(), "the quiet twin of the default ships too"
    entry = (site / next(a for a in added if a.endswith(".dist-info")) / "entry_points.txt").read_text()
    assert "diloco-chaos = diloco_chaos.harness.entry:main" in entry
    assert "diloco_chaos = diloco_chaos.harness.testing.pytest_plugin" in entry
