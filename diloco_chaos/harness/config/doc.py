"""Every scenario key, read from the config dataclasses: docs/scenario.md and `diloco-chaos keys [SECTION]`.

What: `keys()` lists each key a scenario file may hold, section by section (the top-level keys, each table of
diloco_chaos/harness/config/scenario.py's `Scenario` and the dataclasses behind it in diloco_chaos/trainers/,
`[random_faults]`, the keys every `[[faults]]` table takes, each fault kind's parameters and the `at` / `until`
triggers), each with its type, default, allowed range or choices and the docstring under its field. `render()` is
docs/scenario.md; ``python -m diloco_chaos.harness.config.doc`` writes it (``--check``: exit 1 if the committed file
differs), and tests/config/test_scenario_doc.py fails when it is stale. `main_keys` is the `keys` subcommand.

Why: the keys were documented only in the docstrings of the dataclasses; reading them from there keeps one
source, so the reference cannot drift from what the loader accepts. Ranges come from where validation reads them:
a field's `bounded` / `choice` metadata (diloco_chaos/trainers/config.py), diloco_chaos/harness/config/check.py's
ranges for [model] and [data], diloco_chaos/chaos/fault_generator.py's LIMITS for [random_faults].
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.fault_generator import LIMITS, RandomFaultsConfig
from diloco_chaos.chaos.schedule import FaultSpec, Trigger
from diloco_chaos.harness.config.check import SECTION_RANGES
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.doc import field_docs
from diloco_chaos.trainers.config import did_you_mean

DOC = Path(__file__).resolve().parents[3] / "docs" / "scenario.md"
REGENERATE = "python -m diloco_chaos.harness.config.doc"


@dataclass(frozen=True)
class Key:
    """One key of a scenario file."""

    section: str
    """Where it is written: "" (top level), "diloco", "random_faults", "faults", "faults.degrade", "trigger"."""
    name: str
    type: str
    default: str
    allowed: str
    """The range or the choices a value must be in ("" when any value of its type is accepted)."""
    doc: str

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


@dataclass(frozen=True)
class Section:
    """One group of keys: a TOML table of the scenario (or of each [[faults]] entry) and what it is."""

    name: str
    title: str
    summary: str
    keys: tuple[Key, ...]


def type_text(tp: Any) -> str:
    """A field's type as a scenario file writes it."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(type_text(a) for a in args) + (" (optional)" if len(args) < len(typing.get_args(tp))
                                                           else "")
    if origin is Literal:
        return "string"
    if origin is tuple:
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis and typing.get_origin(items[0]) is tuple:
            return "table of numbers"  # random_faults.actions: (name, weight) pairs, written as a table
        return f"list of {type_text(items[0])}s" if items else "list"
    if origin is dict or tp is dict or dataclasses.is_dataclass(tp):
        return "table"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def default_text(f: dataclasses.Field) -> str:
    """The default as TOML writes it; "required" when the field has none, "unset" for None."""
    if f.default is not dataclasses.MISSING:
        return value_text(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return value_text(f.default_factory())
    return "required"


def value_text(value: Any) -> str:
    """A value as TOML writes it ("unset" for None)."""
    if value is None:
        return "unset"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a trigger: as TOML writes one
        pairs = [(k, v) for k, v in dataclasses.asdict(value).items() if v is not None]
        return "{ " + ", ".join(f"{k} = {value_text(v)}" for k, v in pairs) + " }"
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return "{ " + ", ".join(f"{k} = {value_text(v)}" for k, v in value) + " }"  # weights by name
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {value_text(v)}" for k, v in value.items()) + " }" if value else "{}"
    return str(value)


def _num(x: float) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)


def allowed_text(f: dataclasses.Field, ranges: dict[str, tuple[float, float]] | None = None) -> str:
    """A field's range ([lo, hi]) or choices, as validation checks them."""
    choices = f.metadata.get("choices")
    if choices is not None:
        return "one of " + ", ".join(f'"{c}"' for c in choices)
    lo_hi = f.metadata.get("range") or (ranges or {}).get(f.name)
    if lo_hi is not None:
        return f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]"
    return ""


def _first_doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _keys(section: str, cls: type, allowed: typing.Callable[[dataclasses.Field], str],
          skip: tuple[str, ...] = ()) -> tuple[Key, ...]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    return tuple(Key(section, f.name, type_text(hints[f.name]), default_text(f), allowed(f), docs.get(f.name, ""))
                 for f in dataclasses.fields(cls) if f.name not in skip)


def sections() -> list[Section]:
    """Every section of a scenario file, in the order docs/scenario.md lists them."""
    sc_fields = dataclasses.fields(Scenario)
    tables = [f for f in sc_fields if f.default_factory is not dataclasses.MISSING
              and dataclasses.is_dataclass(f.default_factory)]
    top_docs = field_docs(Scenario)
    out = [Section("top", "Top-level keys", "Written before any table.",
                   _keys("", Scenario, allowed_text, skip=tuple(f.name for f in tables) + ("faults",)))]
    for f in tables:
        cls = typing.cast(type, f.default_factory)
        ranges = SECTION_RANGES.get(f.name, {})
        summary = top_docs.get(f.name) or _first_doc(cls)
        out.append(Section(f.name, f"`[{f.name}]`", summary,
                           _keys(f.name, cls, lambda g, r=ranges: allowed_text(g, r))))  # type: ignore[misc]
    out.append(Section("random_faults", "`[random_faults]`",
                       "Failures drawn at a rate (diloco_chaos/chaos/fault_generator.py): before the run, the table is "
                       "expanded, seeded, into explicit `[[faults]]` entries.",
                       _keys("random_faults", RandomFaultsConfig, _random_allowed)))
    out.append(Section("faults", "`[[faults]]`",
                       "One scheduled fault per `[[faults]]` table (diloco_chaos/chaos/schedule.py): its kind "
                       "(`action`), "
                       "whom it hits (`learner`), when it starts (`at`) and ends (`until`), and the "
                       "kind's parameters as flat keys of the same table (`latency_ms = 50`), each kind's in its "
                       "section below; `diloco-chaos keys faults` lists them all.",
                       _keys("faults", FaultSpec, _fault_allowed, skip=("options",))))
    for name, kind in faults.kinds().items():
        summary = f"`action = \"{name}\"`: {kind.summary}." if kind.summary else f'`action = "{name}"`.'
        if kind.required:
            summary += f" Requires {', '.join(kind.required)}."
        out.append(Section(f"faults.{name}", f"`[[faults]]` action = \"{name}\"", summary,
                           _keys(f"faults.{name}", kind.params, allowed_text)))
    out.append(Section("trigger", "Triggers: `at = { ... }`, `until = { ... }`", _first_doc(Trigger),
                       _keys("trigger", Trigger, _trigger_allowed)))
    return out


def _random_allowed(f: dataclasses.Field) -> str:
    if f.name in LIMITS:
        return LIMITS[f.name].text()
    if f.name == "repair":
        from diloco_chaos.chaos.repair_times import REPAIR_DISTRIBUTIONS

        return "one of " + ", ".join(f'"{c}"' for c in REPAIR_DISTRIBUTIONS)
    if f.name == "actions":
        from diloco_chaos.chaos.fault_generator import RANDOM_ACTIONS

        return "weights in [0, 1e6] of " + ", ".join(RANDOM_ACTIONS)
    return ""


def _fault_allowed(f: dataclasses.Field) -> str:
    if f.name == "action":
        return "one of " + ", ".join(f'"{n}"' for n in faults.names())
    if f.name == "learner":
        return "[0, topology.learners - 1]; unset for the syncer's kinds"
    return "a trigger table (below)"


def _trigger_allowed(f: dataclasses.Field) -> str:
    """As diloco_chaos/chaos/schedule.py's `_trigger` checks them: every number >= 0, a learner one of the run's."""
    if f.name == "learner":
        return "[0, topology.learners - 1]"
    numeric = {int, float} & set(typing.get_args(typing.get_type_hints(Trigger)[f.name]))
    return ">= 0" if numeric else ""


def keys(section: str | None = None) -> list[Key]:
    """Every key, or those of `section` and its sub-sections ("faults" includes each kind's parameters).
    ValueError naming the sections for an unknown one."""
    all_sections = sections()
    if section is None:
        return [k for s in all_sections for k in s.keys]
    chosen = [s for s in all_sections if s.name == section or s.name.startswith(section + ".")]
    if not chosen:
        names = [s.name for s in all_sections]
        raise ValueError(f"no section {section!r}{did_you_mean(section, names)}; the sections: {', '.join(names)}")
    return [k for s in chosen for k in s.keys]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole of docs/scenario.md."""
    lines = [
        "# Scenario reference",
        "",
        f"Generated from the config dataclasses by `{REGENERATE}`; do not edit by hand",
        "(tests/config/test_scenario_doc.py fails when this file is stale). `diloco-chaos keys [SECTION]` prints",
        "the same keys in a terminal. Every key is optional unless its default says *required*; a bad value is refused",
        "before any process starts, naming the key and its range (exit code 2), and `diloco-chaos validate",
        "FILE` checks a file without running it. Rules between keys (min_quorum <= learners, the timeout",
        "hierarchy, which backends carry which faults) are checked too and are in each key's meaning.",
        "",
        "Sections: " + ", ".join(f"[{s.title}](#{s.name.replace('.', '')})" for s in sections()),
        "",
    ]
    for s in sections():
        lines += [f'<a id="{s.name.replace(".", "")}"></a>', "", f"## {s.title}", "", s.summary, ""]
        if not s.keys:
            lines += ["No keys.", ""]
            continue
        lines += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        lines += [f"| `{k.name}` | {_cell(k.type)} | `{_cell(k.default)}` | {_cell(k.allowed) or 'any'} | "
                  f"{_cell(k.doc)} |" for k in s.keys]
        lines.append("")
    return "\n".join(lines)


def doc_line(text: str) -> str:
    """The first sentence of a key's documentation."""
    return text[:text.index(". ") + 1] if ". " in text else text


def main_keys(section: str | None) -> int:
    """`diloco-chaos keys [SECTION]`: one line per key (path, type, default, range, first sentence); 2 for an
    unknown section."""
    try:
        chosen = keys(section)
    except ValueError as e:
        print(f"diloco-chaos: {e}", file=sys.stderr)
        return 2
    width = max(len(k.path) for k in chosen)
    for k in chosen:
        rng = f"  {k.allowed}" if k.allowed else ""
        print(f"{k.path:<{width}}  {k.type}, default {k.default}{rng}  -- {doc_line(k.doc)}")
    return 0


def add_parser(sub: Any) -> None:
    """Register `diloco-chaos keys [SECTION]` on the CLI's subparsers."""
    keys_parser = sub.add_parser("keys", help="list every scenario key of a section (or all): type, default, "
                                              "range, meaning (docs/scenario.md)")
    keys_parser.add_argument("section", nargs="?", help="top, diloco, train, ..., random_faults, faults, "
                                                        "faults.<kind>, trigger (default: every section)")
    keys_parser.set_defaults(func=lambda a: main_keys(a.section))


def main(argv: list[str] | None = None) -> int:
    from diloco_chaos.harness.record.doc import write_or_check

    return write_or_check(DOC, render(), REGENERATE, (__doc__ or "").split("\n")[0], argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
