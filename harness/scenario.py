"""Scenario files: TOML in, one validated, frozen `Scenario` out.

Validation happens here, before any process starts: unknown keys, wrong
types, values out of range and cross-field rules (K <= M, the timeout
hierarchy, a corpus that exists) all raise `ScenarioError` naming the key and
what is allowed. The resolved scenario is written into every run directory,
so a run can be replayed from its directory alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast

from chaos import faults
from chaos.schedule import KILL_ACTIONS, FaultSpec, ScheduleError, never_fires, parse_fault
from chaos.toxiproxy_backend import PROXY_MODES, resolve_backend
from trainers.config import ALGORITHMS, DilocoConfig, TrainConfig, bounded, choice, did_you_mean
from trainers.data import CORPUS_NAMES, DataConfig
from trainers.model import ModelConfig

_MODEL_RANGES: dict[str, tuple[float, float]] = {
    "seq_len": (8, 4096),
    "d_model": (8, 4096),
    "n_layers": (1, 64),
    "n_heads": (1, 64),
    "d_ff": (8, 16384),
}
_DATA_RANGES: dict[str, tuple[float, float]] = {"holdout_fraction": (0.01, 0.5), "batch_size": (1, 4096)}


class ScenarioError(ValueError):
    """A scenario value is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class Topology:
    """How many learners and chips run, each a real process."""

    learners: int = bounded(4, 1, 64)
    """M: independent learners; each is its own Gloo group and has its own link to the syncer."""
    chips_per_learner: int = bounded(2, 1, 64)
    """C: chip processes per learner, data-parallel inside the learner (all-reduce every step)."""


@dataclass(frozen=True)
class Timeouts:
    """One hierarchy of bounds; each level must be shorter than the one above it.

    socket_op_s < liveness_s < gloo_s < barrier_s < run_s, heartbeat_s * 3 <= liveness_s and
    barrier_s + gloo_s < run_s (validated before any process starts). In ddp, elastic_ddp and diloco a chip's
    collectives are bounded by barrier_s + gloo_s, since its host may wait barrier_s for the syncer.
    A socket call fails before the link is declared dead; a dead link is noticed before a Gloo
    collective gives up; a blocked baseline learner gives up before the whole run's deadline kills
    everything.
    """

    connect_s: float = bounded(2.0, 0.05, 600.0)
    """TCP connect plus handshake with the syncer."""
    socket_op_s: float = bounded(2.0, 0.05, 600.0)
    """One frame's send or receive on an established link."""
    heartbeat_s: float = bounded(0.5, 0.01, 600.0)
    """A learner host sends a heartbeat when its link has been idle this long."""
    liveness_s: float = bounded(3.0, 0.05, 600.0)
    """The syncer counts a learner as not alive after this long without a frame from it."""
    gloo_s: float = bounded(10.0, 0.5, 3600.0)
    """Timeout of every Gloo collective inside a learner (never Gloo's 30-minute default)."""
    barrier_s: float = bounded(60.0, 1.0, 36000.0)
    """How long a synchronous baseline learner waits for the syncer's result before failing."""
    startup_s: float = bounded(60.0, 1.0, 3600.0)
    """All processes must have started and joined their Gloo group within this."""
    run_s: float = bounded(900.0, 1.0, 86400.0)
    """Hard deadline of the whole run; past it every process is killed and the run fails."""
    shutdown_s: float = bounded(5.0, 0.1, 600.0)
    """Grace between SIGTERM and SIGKILL when the run's processes are stopped."""


@dataclass(frozen=True)
class LinksConfig:
    """The learner<->syncer links: one Toxiproxy proxy per learner, so any of them can be degraded."""

    proxy: str = choice("auto", PROXY_MODES)
    """auto: TOXIPROXY_URL, else toxiproxy-server on PATH, else the embedded server; embedded: always the
    embedded server; off: learners connect to the syncer directly (no link faults possible)."""
    http_timeout_s: float = bounded(5.0, 0.1, 600.0)
    """Timeout of every call to the Toxiproxy HTTP API (toxiproxy-python sets none of its own)."""
    step_time_s: float = bounded(0.15, 0.001, 3600.0)
    """Inner-step time WAN profiles are scaled to (0.15 s: the default scenario on 2 cores)."""


ELASTIC_ALGORITHMS = ("decoupled", "elastic_ddp")
"""Algorithms that are elastic inside a learner: a learner whose non-host chip dies can go on with fewer chips."""

LearnerPolicy = Literal["fail", "restart", "shrink"]


def learner_policy(policy: str, algorithm: str) -> tuple[LearnerPolicy, str]:
    """The learner recovery in force for `algorithm` under `recovery.policy`, and why.

    Pure: 'elastic' resolves to 'shrink' for ELASTIC_ALGORITHMS and to 'restart' for the others (they wait for
    the repair); every other value is taken as written (validation keeps 'shrink' to ELASTIC_ALGORITHMS)."""
    if policy == "elastic":
        if algorithm in ELASTIC_ALGORITHMS:
            return "shrink", f"policy 'elastic': {algorithm} is elastic inside a learner"
        return "restart", f"policy 'elastic': {algorithm} is not elastic inside a learner, it waits for the repair"
    if policy in ("fail", "restart", "shrink"):
        return cast(LearnerPolicy, policy), f"policy {policy!r} as written"
    raise ValueError(f"recovery.policy = {policy!r}: not one of fail, restart, shrink, elastic")


@dataclass(frozen=True)
class RecoveryConfig:
    """What the supervisor does when a learner fails (a chip process dies or its Gloo group breaks)."""

    policy: Literal["fail", "restart", "shrink", "elastic"] = choice("fail", ("fail", "restart", "shrink",
                                                                             "elastic"))
    """fail: the run fails (any chip failure is a bug to see); restart: the whole learner is stopped and,
    after repair_s, started again as a new Gloo group; it pulls the global model and resumes its steps;
    shrink (decoupled and elastic_ddp only): when chips other than the host die, the survivors re-form a
    smaller group on a fresh store prefix and keep training with fewer tokens per step; each lost chip is
    started again after repair_s and joins at a step boundary. A lost host (chip 0, the link) falls back to
    restart. elastic: each algorithm's own recovery, so one scenario compares them: shrink for the algorithms
    that are elastic inside a learner (ELASTIC_ALGORITHMS), restart for the others (ddp and diloco wait for
    the repair); `learner_policy` resolves it."""
    repair_s: float = bounded(2.0, 0.0, 3600.0)
    """Repair delay: seconds between a learner's failure and its restart."""
    max_restarts: int = bounded(3, 0, 1000)
    """Restarts allowed per learner (and for the syncer); one more failure fails the run."""
    syncer_policy: str = choice("fail", ("fail", "restart"))
    """fail: a syncer that dies fails the run; restart: after syncer_repair_s the supervisor starts a new
    syncer on the same port, which restores the per-fragment checkpoint (Decoupled DiLoCo only)."""
    syncer_repair_s: float = bounded(1.0, 0.0, 3600.0)
    """Seconds between the syncer's death and its restart (a kill_syncer fault's repair_s overrides it)."""
    syncer_checkpoint: str = choice("every_merge", ("every_merge", "off"))
    """every_merge: each merged fragment's state is written atomically (temp file, rename) before it is
    broadcast, so a restarted syncer loses nothing any learner has seen; off: no syncer checkpoint."""
    syncer_checkpoint_fsync: bool = False
    """Also fdatasync each fragment checkpoint slot (and its directory when the slot file is created) before the
    broadcast: survives the machine losing power, not only the syncer process dying (which the in-place write
    alone covers: the page cache outlives the process), at the cost of a disk flush per merge."""


@dataclass(frozen=True)
class EvalConfig:
    """Eval loss of the global model, computed by the syncer off the learners' hot path."""

    points: int = bounded(24, 0, 10_000)
    """Periodic evaluations spread evenly over the run's planned training: one each time its progress (tokens
    merged for the synchronous algorithms, learner-steps reported for decoupled) passes another 1/points of
    it, so a curve has about this many points whatever the run's length. 0: only `every_s` triggers."""
    every_s: float = bounded(3.0, 0.1, 3600.0)
    """Longest wall gap, in seconds, between two periodic evaluations of the global model (a wall-clock
    trigger besides `points`, for stretches where nothing is merged)."""
    max_share: float = bounded(0.05, 0.001, 1.0)
    """Largest share of one core the `points` evaluations may take (the last one's CPU time over the gap since
    it started): a milestone that comes sooner waits, so a run of a few seconds gets fewer points instead of
    slower chips. The `every_s` evaluations are not held back."""
    batches: int = bounded(4, 1, 10_000)
    """Held-out batches (of 16 sequences) per periodic evaluation; the final one uses them all."""


@dataclass(frozen=True)
class Scenario:
    """Everything a run needs. Written, resolved, into the run directory as config.json."""

    name: str = "default"
    """Free-form name, used in the run directory's name."""
    seed: int = bounded(0, 0, 2**31 - 1)
    """Seeds model init, data order and every random choice of the harness."""
    algorithm: str = choice("decoupled", ALGORITHMS)
    """decoupled (Decoupled DiLoCo), diloco (synchronous DiLoCo), ddp (synchronous data parallel) or elastic_ddp
    (data parallel whose global group drops a lost learner and admits it again after its repair)."""
    topology: Topology = field(default_factory=Topology)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    eval: EvalConfig = field(default_factory=EvalConfig)
    links: LinksConfig = field(default_factory=LinksConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    faults: tuple[FaultSpec, ...] = ()
    """Scheduled faults, `[[faults]]` tables (chaos/schedule.py): action, learner, at, until, parameters."""
    random_faults_source: str = ""
    """Record only: the `[random_faults]` table (JSON) whose draws were appended to `faults` before the run
    (chaos/fault_generator.py). The draws are already explicit entries, so a replay does not draw again."""

    def replace(self, **changes: Any) -> Scenario:
        """A copy with top-level fields changed, validated again. `faults` may be given as tables."""
        if "faults" in changes:
            learners = changes.get("topology", self.topology).learners
            try:
                changes["faults"] = tuple(parse_fault(f, f"faults[{i}]", learners)
                                          for i, f in enumerate(changes["faults"]))
            except ScheduleError as e:
                raise ScenarioError(str(e)) from None
        out = dataclasses.replace(self, **changes)
        validate(out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The scenario as tables, each fault in its flat `[[faults]]` form (from_dict reads it back)."""
        out = dataclasses.asdict(self)
        out["faults"] = [f.to_table() for f in self.faults]
        return out


def _check_value(key: str, f: dataclasses.Field, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScenarioError(f"{key} = {value!r}: must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{key} = {value!r}: must be an integer")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{key} = {value!r}: must be a number")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ScenarioError(f"{key} = {value!r}: must be a string")
    elif isinstance(default, tuple):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ScenarioError(f"{key} = {value!r}: must be a list of strings")
        value = tuple(value)
    return value


def _build(cls: type, table: Any, prefix: str, ranges: dict[str, tuple[float, float]] | None = None) -> Any:
    if not isinstance(table, dict):
        raise ScenarioError(f"{prefix or 'scenario'}: must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        where = f"[{prefix}]" if prefix else "the top level"
        raise ScenarioError(
            f"unknown key {prefix + '.' if prefix else ''}{unknown[0]}{did_you_mean(unknown[0], fields)} in {where}; "
            f"allowed: {', '.join(fields)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        f = fields[name]
        key = f"{prefix}.{name}" if prefix else name
        if cls is Scenario and name == "faults":
            if not isinstance(value, (list, tuple)):
                raise ScenarioError(f"faults = {value!r}: must be an array of tables ([[faults]])")
            kwargs[name] = tuple(_fault(v, i, table) for i, v in enumerate(value))
            continue
        if dataclasses.is_dataclass(f.type) or (f.default_factory is not dataclasses.MISSING):  # nested table
            sub = f.default_factory()  # type: ignore[misc,operator]
            sub_ranges: dict[str, tuple[float, float]] | None = {"model": _MODEL_RANGES,
                                                                  "data": _DATA_RANGES}.get(name)
            kwargs[name] = _build(type(sub), value, key, sub_ranges)
            continue
        default = f.default
        kwargs[name] = _check_value(key, f, value, default)
    obj = cls(**kwargs)
    _check_ranges(obj, prefix, ranges or {})
    return obj


def _fault(raw: Any, i: int, table: dict[str, Any]) -> FaultSpec:
    learners = table.get("topology", {}).get("learners", Topology().learners)
    learners = learners if isinstance(learners, int) and learners > 0 else Topology().learners
    try:
        return parse_fault(raw, f"faults[{i}]", learners)
    except ScheduleError as e:
        raise ScenarioError(str(e)) from None


def _check_ranges(obj: Any, prefix: str, extra: dict[str, tuple[float, float]]) -> None:
    for f in dataclasses.fields(obj):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(obj, f.name)
        lo_hi = f.metadata.get("range") or extra.get(f.name)
        if lo_hi is not None and not (lo_hi[0] <= value <= lo_hi[1]):
            raise ScenarioError(f"{key} = {value!r}: must be in [{lo_hi[0]}, {lo_hi[1]}]")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ScenarioError(f"{key} = {value!r}: must be one of {', '.join(choices)}")


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A scenario's name is part of its run directory's name: a letter or digit, then letters, digits, '.', '_' or
'-', at most 64 characters (no '/', no '..' path, nothing a shell or a file system would read otherwise)."""


def _check_link_backend(sc: Scenario) -> None:
    """Every link fault must be one the run's Toxiproxy server implements (e.g. corrupt is an extension of the
    embedded server): decided from links.proxy and the environment (TOXIPROXY_URL, toxiproxy-server on PATH)
    the way the supervisor will decide it, before any process starts."""
    link_faults = [(i, f) for i, f in enumerate(sc.faults) if faults.get(f.action).target == "link"]
    if not link_faults:
        return
    backend = resolve_backend(sc.links.proxy)
    if backend.family is None:
        raise ScenarioError("links.proxy = 'off': link faults need proxies; use auto or embedded")
    for i, f in link_faults:
        kind = faults.get(f.action)
        if backend.family not in kind.backends:
            raise ScenarioError(
                f"faults[{i}].action = {f.action!r}: not supported by the {backend.family} backend "
                f"({backend.why}); {f.action} runs on: {', '.join(sorted(kind.backends))}"
                + (" (links.proxy = 'embedded' picks the embedded server)" if "embedded" in kind.backends else ""))


def validate(sc: Scenario) -> None:
    """Check ranges and the rules that tie fields together. Raises ScenarioError."""
    if not isinstance(sc.name, str) or not NAME_PATTERN.fullmatch(sc.name):
        raise ScenarioError(f"name = {sc.name!r}: must be a letter or digit, then letters, digits, '.', '_' or '-', "
                            "at most 64 characters (it names the run directory)")
    _check_ranges(sc, "", {})
    for name, sub_ranges in (("topology", {}), ("model", _MODEL_RANGES), ("data", _DATA_RANGES), ("train", {}),
                             ("diloco", {}), ("timeouts", {}), ("eval", {}), ("links", {}), ("recovery", {})):
        _check_ranges(getattr(sc, name), name, sub_ranges)
    m = sc.topology.learners
    for i, f in enumerate(sc.faults):
        try:
            parse_fault(f, f"faults[{i}]", m)
        except ScheduleError as e:
            raise ScenarioError(str(e)) from None
    for i, f in enumerate(sc.faults):
        why = never_fires(f, sc.train.steps, sc.timeouts.run_s)
        if why is not None:
            raise ScenarioError(f"faults[{i}].{why} (the fault could never fire)")
        if f.chip is not None and f.chip >= sc.topology.chips_per_learner:
            raise ScenarioError(f"faults[{i}].chip = {f.chip}: must be in [0, {sc.topology.chips_per_learner - 1}]"
                                " (topology.chips_per_learner)")
        kind = faults.get(f.action)
        if kind.target == "process" and f.action in KILL_ACTIONS and sc.recovery.policy == "fail":
            raise ScenarioError(f"faults[{i}].action = {f.action!r}: needs recovery.policy = 'restart' "
                                "(with 'fail' the first lost chip ends the run)")
        if kind.target == "syncer":
            if sc.algorithm != "decoupled":
                raise ScenarioError(f"faults[{i}].action = {f.action!r}: supported for algorithm = 'decoupled' "
                                    f"only, not {sc.algorithm!r} (its syncer keeps no checkpoint to restore)")
            if sc.recovery.syncer_policy != "restart" or sc.recovery.syncer_checkpoint != "every_merge":
                raise ScenarioError(f"faults[{i}].action = {f.action!r}: needs recovery.syncer_policy = 'restart' "
                                    "and recovery.syncer_checkpoint = 'every_merge'")
    if sc.recovery.policy == "shrink" and sc.algorithm not in ELASTIC_ALGORITHMS:
        raise ScenarioError(f"recovery.policy = 'shrink': supported for algorithm in {ELASTIC_ALGORITHMS} "
                            f"only, not {sc.algorithm!r}; use 'restart', or 'elastic' (shrink where the "
                            "algorithm has it, restart elsewhere)")
    _check_link_backend(sc)
    if sc.diloco.min_quorum > m:
        raise ScenarioError(
            f"diloco.min_quorum = {sc.diloco.min_quorum}: must be in [1, topology.learners = {m}]"
        )
    if sc.model.d_model % sc.model.n_heads:
        raise ScenarioError(f"model.n_heads = {sc.model.n_heads}: must divide model.d_model = {sc.model.d_model}")
    n_tensors = 5 + 12 * sc.model.n_layers  # tensors of TinyGPT; the partition needs one per fragment
    if sc.diloco.fragments > n_tensors:
        raise ScenarioError(
            f"diloco.fragments = {sc.diloco.fragments}: must be in [1, {n_tensors}] (tensors in the model)"
        )
    if sc.data.corpus not in CORPUS_NAMES and not os.path.isfile(sc.data.corpus):
        raise ScenarioError(
            f"data.corpus = {sc.data.corpus!r}: no such file; use one of {', '.join(CORPUS_NAMES)} or a text file path"
        )
    t = sc.timeouts
    chain = [("timeouts.socket_op_s", t.socket_op_s), ("timeouts.liveness_s", t.liveness_s),
             ("timeouts.gloo_s", t.gloo_s), ("timeouts.barrier_s", t.barrier_s), ("timeouts.run_s", t.run_s)]
    for (lo_key, lo), (hi_key, hi) in zip(chain, chain[1:], strict=False):
        if not lo < hi:
            raise ScenarioError(f"{lo_key} = {lo}: must be below {hi_key} = {hi} (timeout hierarchy)")
    if t.barrier_s + t.gloo_s >= t.run_s:
        raise ScenarioError(f"timeouts.barrier_s = {t.barrier_s}: barrier_s + gloo_s must be below timeouts.run_s = "
                            f"{t.run_s} (baseline chips wait up to barrier_s + gloo_s)")
    if t.heartbeat_s * 3 > t.liveness_s:
        raise ScenarioError(
            f"timeouts.heartbeat_s = {t.heartbeat_s}: must be at most timeouts.liveness_s / 3 = {t.liveness_s / 3:g}"
        )


def _int_or(table: dict[str, Any], section: str, key: str, default: int, least: int = 1) -> int:
    """table[section][key] if it is a usable integer (>= least), else the default (_build reports it later)."""
    v = table.get(section, {}).get(key, default) if isinstance(table.get(section, {}), dict) else default
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= least else default


def _expand_random_faults(table: dict[str, Any]) -> dict[str, Any]:
    """Replace a `[random_faults]` table by the explicit `[[faults]]` entries it draws (seeded)."""
    from chaos.fault_generator import expand
    from chaos.fault_generator import validate as validate_random

    raw = table["random_faults"]
    # What the draw's size depends on is checked first: a bad topology must not be expanded into faults.
    topology = _build(Topology, table.get("topology", {}), "topology")
    _check_ranges(topology, "topology", {})
    train = _build(TrainConfig, table.get("train", {}), "train")
    _check_ranges(train, "train", {})
    learners, chips, steps = topology.learners, topology.chips_per_learner, train.steps
    seed = table.get("seed", 0) if isinstance(table.get("seed", 0), int) else 0
    try:
        cfg = validate_random(raw, "random_faults", learners, chips, steps)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    drawn = expand(cfg, learners=learners, chips_per_learner=chips, steps=steps, seed=seed)
    restarts = _int_or(table, "recovery", "max_restarts", RecoveryConfig().max_restarts, least=0)
    kills: dict[int, int] = {}
    for f in drawn:
        if f["action"] in ("kill_chip", "kill_learner", "crash_host"):
            kills[f["learner"]] = kills.get(f["learner"], 0) + 1
    worst = max(kills.items(), key=lambda kv: kv[1], default=None)
    if worst is not None and worst[1] > restarts:
        raise ScenarioError(f"random_faults: the draw kills learner {worst[0]} {worst[1]} times, but "
                            f"recovery.max_restarts = {restarts}; raise it to at least {worst[1]}, "
                            "or raise random_faults.mtbf_steps")
    out = {k: v for k, v in table.items() if k != "random_faults"}
    existing = table.get("faults", [])
    out["faults"] = [*(existing if isinstance(existing, (list, tuple)) else [existing]), *drawn]
    out["random_faults_source"] = json.dumps(raw if isinstance(raw, dict) else str(raw), sort_keys=True,
                                             default=str)
    return out


def from_dict(table: dict[str, Any]) -> Scenario:
    """Build and validate a Scenario from a parsed TOML table (a `[random_faults]` table is drawn first)."""
    if "random_faults" in table:
        table = _expand_random_faults(table)
    sc = _build(Scenario, table, "")
    validate(sc)
    return sc


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Parse a TOML file; a missing file or bad TOML is a ScenarioError naming `what` and the path."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{what} {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{what} {str(p)!r} is not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{what} {str(p)!r} is not UTF-8 text (byte {e.start}): TOML files are UTF-8") from e
    except OSError as e:
        raise ScenarioError(f"{what} {str(p)!r} cannot be read: {e.strerror or e}") from e


def load(path: str | os.PathLike[str]) -> Scenario:
    """Read a TOML scenario file. Raises ScenarioError with the key for any bad value."""
    return from_dict(read_toml(path, "scenario file"))


def builtin(name: str = "default") -> Scenario:
    """One of the scenarios shipped inside the package (harness/scenarios/NAME.toml)."""
    names = builtin_names()
    if name not in names:
        raise ScenarioError(f"no built-in scenario {name!r}; the built-in ones: {', '.join(names)}")
    text = resources.files("harness").joinpath("scenarios", f"{name}.toml").read_text(encoding="utf-8")
    return from_dict(tomllib.loads(text))


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("harness").joinpath("scenarios").iterdir()
                  if p.name.endswith(".toml"))
