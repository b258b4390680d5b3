"""Incident files explore writes: a schedule as `[[faults]]` tables (examples/incidents/*.toml's format, read by
diloco_chaos/harness/run/replay.py `load_incident`), and the command that runs it.

Why its own writer: the standard library reads TOML but does not write it, and an incident file is read by
people first: one `[[faults]]` table per fault, its trigger as an inline table, the description as comments.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diloco_chaos.trainers.mutations import ENV_VAR


def toml_value(v: Any) -> str:
    """A scalar or an inline table as TOML writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} has no TOML form here")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise ValueError(f"{v!r}: no TOML form")


def incident_text(tables: Sequence[dict[str, Any]], description: str, comments: Sequence[str] = ()) -> str:
    """An incident file: comment lines, `description`, then one `[[faults]]` table per fault."""
    lines = [f"# {c}" for c in comments] + [f"description = {toml_value(description)}"]
    for t in tables:
        lines += ["", "[[faults]]"] + [f"{k} = {toml_value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


def write_incident(path: Path, tables: Sequence[dict[str, Any]], description: str,
                   comments: Sequence[str] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(incident_text(tables, description, comments), encoding="utf-8")
    return path


def run_command(run_args: Sequence[str], incident: str | os.PathLike[str]) -> str:
    """The shell command that runs `diloco-chaos run` on the scenario with the incident, with the mutation this
    process runs under (DILOCO_CHAOS_MUTATION), when one is set, in front."""
    mutation = os.environ.get(ENV_VAR, "").strip()
    prefix = f"{ENV_VAR}={shlex.quote(mutation)} " if mutation else ""
    return prefix + shlex.join(["diloco-chaos", "run", *run_args, "--incident", str(incident)])
