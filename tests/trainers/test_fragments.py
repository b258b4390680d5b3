"""Tests for diloco_chaos.trainers.fragments: balanced LPT partitioning and the fragment sync schedule."""

from __future__ import annotations

import itertools
import random

import pytest

from diloco_chaos.trainers.fragments import FragmentSchedule, fragment_sizes_report, partition_tensors


def llama_like_sizes(n_layers: int = 32, d: int = 4096, d_ff: int = 11008, vocab: int = 32000) -> dict:
    """Tensor sizes of a LLaMA-7B-shaped decoder, in model order."""
    sizes = {"embed.weight": vocab * d}
    for i in range(n_layers):
        sizes[f"l{i}.attn_norm"] = d
        for w in ("q", "k", "v", "o"):
            sizes[f"l{i}.attn.{w}"] = d * d
        sizes[f"l{i}.mlp_norm"] = d
        for w in ("gate", "up", "down"):
            sizes[f"l{i}.mlp.{w}"] = d * d_ff
    sizes["final_norm"] = d
    sizes["lm_head.weight"] = vocab * d
    return sizes


def gpt_small_like_sizes(n_layers: int = 12, d: int = 768, vocab: int = 256, seq: int = 1024) -> dict:
    """Tensor sizes of a GPT-2-small-shaped decoder with a byte vocabulary (biases included)."""
    sizes = {"tok_emb": vocab * d, "pos_emb": seq * d}
    for i in range(n_layers):
        sizes.update(
            {
                f"b{i}.ln1.w": d,
                f"b{i}.ln1.b": d,
                f"b{i}.qkv.w": 3 * d * d,
                f"b{i}.qkv.b": 3 * d,
                f"b{i}.proj.w": d * d,
                f"b{i}.proj.b": d,
                f"b{i}.ln2.w": d,
                f"b{i}.ln2.b": d,
                f"b{i}.fc1.w": 4 * d * d,
                f"b{i}.fc1.b": 4 * d,
                f"b{i}.fc2.w": 4 * d * d,
                f"b{i}.fc2.b": d,
            }
        )
    sizes.update({"ln_f.w": d, "ln_f.b": d, "head": vocab * d})
    return sizes


@pytest.mark.parametrize("make_sizes", [llama_like_sizes, gpt_small_like_sizes])
@pytest.mark.parametrize("p", [2, 4, 8, 24])
def test_partition_realistic_is_balanced_and_exact_cover(make_sizes, p: int) -> None:
    sizes = make_sizes()
    part = partition_tensors(sizes, p)
    assert len(part) == p
    flat = [n for group in part for n in group]
    assert sorted(flat) == sorted(sizes)  # every tensor in exactly one fragment
    assert len(flat) == len(set(flat))
    assert all(group for group in part)
    report = fragment_sizes_report(part, sizes)
    assert sum(report["sizes"]) == sum(sizes.values())
    assert report["max_over_mean"] <= 4 / 3
    # within a fragment names follow model order
    order = {n: i for i, n in enumerate(sizes)}
    for group in part:
        assert [order[n] for n in group] == sorted(order[n] for n in group)


def test_partition_is_deterministic() -> None:
    sizes = gpt_small_like_sizes()
    assert partition_tensors(sizes, 24) == partition_tensors(dict(sizes), 24)


def test_partition_matches_classic_lpt_worst_case() -> None:
    # Graham's tight example for m=3: LPT gives 11, the optimum is 9.
    sizes = {"a": 5, "b": 5, "c": 4, "d": 4, "e": 3, "f": 3, "g": 3}
    part = partition_tensors(sizes, 3)
    assert part == [["a", "e", "g"], ["b", "f"], ["c", "d"]]
    assert fragment_sizes_report(part, sizes)["sizes"] == [11, 8, 8]


def test_partition_ties_go_to_lowest_index_and_keep_model_order() -> None:
    sizes = {"x": 1, "y": 1, "z": 1, "w": 1}
    assert partition_tensors(sizes, 2) == [["x", "z"], ["y", "w"]]
    assert partition_tensors({"s": 1, "big": 10, "t": 1}, 2) == [["big"], ["s", "t"]]


def _brute_force_makespan(values: list[int], p: int) -> int:
    best = sum(values)
    for assign in itertools.product(range(p), repeat=len(values)):
        loads = [0] * p
        for v, f in zip(values, assign, strict=False):
            loads[f] += v
        best = min(best, max(loads))
    return best


def test_partition_within_lpt_bound_of_optimum_on_random_instances() -> None:
    rng = random.Random(1234)
    for _ in range(40):
        n, p = rng.randint(3, 8), rng.randint(2, 3)
        p = min(p, n)
        values = [rng.randint(1, 50) for _ in range(n)]
        sizes = {f"t{i}": v for i, v in enumerate(values)}
        got = max(fragment_sizes_report(partition_tensors(sizes, p), sizes)["sizes"])
        opt = _brute_force_makespan(values, p)
        assert got <= (4 / 3 - 1 / (3 * p)) * opt + 1e-9


def test_partition_rejects_bad_fragment_counts() -> None:
    sizes = {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="num_fragments"):
        partition_tensors(sizes, 0)
    with pytest.raises(ValueError, match="exceeds the number of tensors"):
        partition_tensors(sizes, 3)
    with pytest.raises(ValueError, match="negative"):
        partition_tensors({"a": -1}, 1)


def test_sizes_report_values() -> None:
    report = fragment_sizes_report([["a"], ["b", "c"]], {"a": 6, "b": 1, "c": 1})
    assert report == {"sizes": [6, 2], "max_over_mean": 1.5}
    with pytest.raises(ValueError):
        fragment_sizes_report([["a", "zz"]], {"a": 1})


def _due_table(s: FragmentSchedule, steps: int) -> dict[int, list[int]]:
    return {t: s.fragments_due(t) for t in range(1, steps + 1)}


def _each_fragment_once_per_period(s: FragmentSchedule, steps: int) -> None:
    table = _due_table(s, steps)
    for start in range(1, steps - s.period + 2):
        window = [p for t in range(start, start + s.period) for p in table[t]]
        assert sorted(window) == list(range(s.num_fragments)), start


def test_schedule_p_equals_h_one_fragment_per_step() -> None:
    s = FragmentSchedule(num_fragments=24, period=24, overlap=2)
    table = _due_table(s, 96)
    assert all(len(due) == 1 for due in table.values())
    assert table[1] == [1] and table[23] == [23] and table[24] == [0] and table[25] == [1]
    _each_fragment_once_per_period(s, 96)
    # with tau = 2, exactly two fragments are in flight after every step once warmed up
    for t in range(3, 96):
        in_flight = [p for sent in range(1, t + 1) for p in table[sent] if s.apply_step(sent) > t]
        assert len(in_flight) == 2


def test_schedule_p_less_than_h_spreads_fragments() -> None:
    s = FragmentSchedule(num_fragments=3, period=24, overlap=2)
    assert [s.offset(p) for p in range(3)] == [0, 8, 16]
    table = _due_table(s, 72)
    due_steps = [t for t, due in table.items() if due]
    assert all(len(table[t]) == 1 for t in due_steps)
    assert due_steps[:4] == [8, 16, 24, 32]
    assert {b - a for a, b in itertools.pairwise(due_steps)} == {8}
    _each_fragment_once_per_period(s, 72)


def test_schedule_p_not_dividing_h() -> None:
    s = FragmentSchedule(num_fragments=5, period=12, overlap=1)
    table = _due_table(s, 48)
    assert sum(len(d) for d in table.values()) == 4 * 5
    assert all(len(d) <= 1 for d in table.values())
    _each_fragment_once_per_period(s, 48)


@pytest.mark.parametrize(("p", "h"), [(6, 3), (5, 3), (48, 24)])
def test_schedule_p_greater_than_h_several_per_step(p: int, h: int) -> None:
    s = FragmentSchedule(num_fragments=p, period=h, overlap=2)
    counts = [len(s.fragments_due(t)) for t in range(1, 4 * h + 1)]
    assert min(counts) >= p // h and max(counts) <= -(-p // h)
    assert max(counts) >= 2 and sum(counts) == 4 * p
    _each_fragment_once_per_period(s, 4 * h)


def test_schedule_apply_step_and_validation() -> None:
    s = FragmentSchedule(num_fragments=4, period=4, overlap=2)
    assert s.apply_step(7) == 9
    assert FragmentSchedule(2, 4, 0).apply_step(7) == 7
    with pytest.raises(ValueError):
        s.offset(4)
    with pytest.raises(ValueError):
        s.fragments_due(0)
    with pytest.raises(ValueError):
        FragmentSchedule(0, 4, 2)
    with pytest.raises(ValueError):
        FragmentSchedule(2, 0, 2)
    with pytest.raises(ValueError):
        FragmentSchedule(2, 4, -1)


def test_schedule_sync_index_counts_the_sync_points_reached() -> None:
    s = FragmentSchedule(num_fragments=4, period=4, overlap=2)  # fragment p due at steps t % 4 == p
    assert [s.sync_index(1, t) for t in range(0, 10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert [s.sync_index(0, t) for t in range(0, 10)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    for p in range(4):  # it grows exactly at the steps fragments_due names
        assert [t for t in range(1, 30) if s.sync_index(p, t) > s.sync_index(p, t - 1)] == [
            t for t in range(1, 30) if p in s.fragments_due(t)]
