"""ckpt's planner against megatron-core's own distribution functions.

The pinned megatron-core (python/requirements.lock) is imported, never copied: random problems
go to its `distribute_shards_to_ranks` and `determine_main_replica_uniform_distribution`, and the
same problems go to `ckptctl plan distribute` / `ckptctl plan main-replicas` (the planner's JSON
Lines interface). Assignments, and the order in which they are made, must be identical.

`determine_main_replica_uniform_distribution` gathers every rank's shard metadata with
`torch.distributed.all_gather_object` over the parallelization group; here the group is a
stand-in whose gather returns the problem's per-rank metadata, so the upstream code after the
gather (holders, sizes from the lowest rank, main/non-main groups, cross-group loads, the
distribution) runs unchanged.
"""

import json
import os
import random
import subprocess

import pytest
import torch
from megatron.core.dist_checkpointing import exchange_utils
from megatron.core.dist_checkpointing.mapping import ShardedTensor

CKPTCTL = os.environ["CKPTCTL"]

# Keys chosen so that ordering matters: shared prefixes, a prefix of another key, non-ASCII
# code points (Python compares code points; UTF-8 byte order agrees), dots and digits.
KEYS = ["a", "a.b", "ab", "b", "decoder.0.w", "decoder.10.w", "decoder.2.w", "é", "层.w", "😀",
        "z"]


# Holder ranks outside [0, num_ranks) are an input error for `ckptctl plan` unless kept as
# megatron-core keeps them (counted in len(holders), never chosen); the problems below use them.
MEGATRON_FLAGS = {"distribute": ["--keep-out-of-range-ranks"], "main-replicas": []}


def to_json_id(shard_id):
    key, offsets, flat = shard_id
    return [key, list(offsets), None if flat is None else list(flat)]


def from_json_id(value):
    key, offsets, flat = value
    return (key, tuple(offsets), None if flat is None else tuple(flat))


def run_ckptctl(mode, lines, extra=()):
    """Runs `ckptctl plan <mode>` on JSON Lines; returns the parsed output lines."""
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    done = subprocess.run([CKPTCTL, "plan", mode] + MEGATRON_FLAGS[mode] + list(extra),
                          input=text.encode(),
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(out) for out in done.stdout.decode().splitlines()]


def random_ids(rng, count, allow_flat):
    """Distinct shard ids. With flat ranges, a (key, offsets) pair is either always without a
    flat range or always with one: mixing them is the one tie Python cannot order (tested
    separately)."""
    ids = set()
    flat_for = {}
    dims = rng.choice([1, 2, 3])
    while len(ids) < count:
        key = rng.choice(KEYS)
        ndim = dims if rng.random() < 0.8 else rng.choice([0, 1, 2, 3])
        offsets = tuple(rng.choice([0, 0, 1, 4, 64, 1 << 33]) for _ in range(ndim))
        flat = None
        if allow_flat and flat_for.setdefault((key, offsets), rng.random() < 0.3):
            start = rng.choice([0, 0, 5, 1 << 20])
            flat = (start, start + rng.choice([1, 7, 4096]))
        ids.add((key, offsets, flat))
    ids = list(ids)
    rng.shuffle(ids)
    return ids


def random_distribute_problem(rng):
    num_ranks = rng.choice([1, 2, 3, 4, 5, 8, 16, 64])
    ids = random_ids(rng, rng.randint(1, 40), allow_flat=True)
    # Few distinct sizes and holder sets, so that ties reach the later sort keys.
    sizes = [rng.choice([0, 1, 8, 8, 64, 4096, 1 << 40]) for _ in range(3)]
    shard_to_ranks, shard_to_size = {}, {}
    for shard_id in ids:
        holders = rng.sample(range(num_ranks), rng.randint(1, min(num_ranks, 4)))
        if rng.random() < 0.1:
            holders.append(holders[0])  # a repeated holder counts in len(), as upstream
        if rng.random() < 0.1:
            holders.append(num_ranks + rng.randint(0, 3))  # out of range: never chosen
        shard_to_ranks[shard_id] = holders
        shard_to_size[shard_id] = rng.choice(sizes)
    cross = {shard_id for shard_id in ids if rng.random() < 0.2}
    return shard_to_ranks, shard_to_size, num_ranks, cross  # upstream's argument order


def distribute_line(shard_to_ranks, shard_to_size, num_ranks, cross):
    return {
        "num_ranks": num_ranks,
        "shard_to_ranks": [[to_json_id(s), r] for s, r in shard_to_ranks.items()],
        "shard_to_size": [[to_json_id(s), b] for s, b in shard_to_size.items()],
        "cross_group": [to_json_id(s) for s in cross],
    }


def test_distribute_matches_megatron_core_on_3000_random_problems():
    rng = random.Random(1123)
    problems = [random_distribute_problem(rng) for _ in range(3000)]
    outputs = run_ckptctl("distribute", [distribute_line(*p) for p in problems])
    assert len(outputs) == len(problems)
    for index, (problem, output) in enumerate(zip(problems, outputs)):
        expected = exchange_utils.distribute_shards_to_ranks(*problem)
        got = [(from_json_id(s), r) for s, r in output["assignment"]]
        assert got == list(expected.items()), f"problem {index}: {problem}"


def test_distribute_matches_megatron_core_on_large_problems():
    rng = random.Random(7)
    problems = []
    for _ in range(5):
        num_ranks = rng.choice([256, 512])
        ids = random_ids(rng, 5000, allow_flat=True)
        shard_to_ranks = {s: rng.sample(range(num_ranks), rng.randint(1, 8)) for s in ids}
        shard_to_size = {s: rng.choice([1024, 4096, 1 << 20]) for s in ids}
        problems.append((shard_to_ranks, shard_to_size, num_ranks, set(ids[:50])))
    outputs = run_ckptctl("distribute", [distribute_line(*p) for p in problems])
    for problem, output in zip(problems, outputs):
        expected = exchange_utils.distribute_shards_to_ranks(*problem)
        assert [(from_json_id(s), r) for s, r in output["assignment"]] == list(expected.items())


def upstream_raises(problem):
    try:
        exchange_utils.distribute_shards_to_ranks(*problem)
    except (TypeError, ValueError):
        return True
    return False


def ckptctl_fails(problem):
    text = json.dumps(distribute_line(*problem), ensure_ascii=False) + "\n"
    done = subprocess.run([CKPTCTL, "plan", "distribute"] + MEGATRON_FLAGS["distribute"],
                          input=text.encode(), capture_output=True, timeout=60)
    return done.returncode != 0


def test_distribute_fails_exactly_where_megatron_core_raises():
    # Ties on everything but "no flat range" vs "a flat range" (Python cannot compare None
    # with a tuple) and shards with no valid holder, mixed with problems that are fine.
    rng = random.Random(99)
    checked_raising = 0
    for _ in range(150):
        num_ranks = rng.choice([2, 3])
        shard_to_ranks, shard_to_size = {}, {}
        for _ in range(rng.randint(2, 5)):
            key = rng.choice(["a", "b"])
            flat = None if rng.random() < 0.5 else (0, rng.choice([1, 2]))
            shard_id = (key, (0,), flat)
            shard_to_ranks[shard_id] = [rng.choice([0, 1, num_ranks + 1])]
            shard_to_size[shard_id] = rng.choice([4, 8])
        problem = (shard_to_ranks, shard_to_size, num_ranks, set())
        raises = upstream_raises(problem)
        checked_raising += raises
        assert ckptctl_fails(problem) == raises, problem
    assert checked_raising > 10  # the generator really produced failing problems


def sharded_tensor(shard_id, dtype, local_shape, replica_id):
    key, offsets, _ = shard_id
    return ShardedTensor(key=key, data=None, dtype=dtype, local_shape=tuple(local_shape),
                         global_shape=tuple(o + s for o, s in zip(offsets, local_shape)),
                         global_offset=offsets, axis_fragmentations=None,
                         replica_id=replica_id)


class GatheringGroup:
    """A parallelization group of N ranks whose all_gather_object yields `per_rank`."""

    def __init__(self, per_rank):
        self.per_rank = per_rank

    def size(self):
        return len(self.per_rank)


def upstream_main_replicas(per_rank, ignore_groups, monkeypatch):
    def all_gather_object(object_list, obj, group=None):
        for rank, shards in enumerate(group.per_rank):
            object_list[rank] = [sh.without_data() for sh in shards]

    monkeypatch.setattr(exchange_utils.torch.distributed, "all_gather_object", all_gather_object)
    monkeypatch.setattr(exchange_utils, "get_pg_size", lambda group=None: group.size())
    return exchange_utils.determine_main_replica_uniform_distribution(
        {}, GatheringGroup(per_rank), ignore_groups=ignore_groups)


def random_main_replica_problem(rng):
    num_ranks = rng.choice([2, 3, 4, 6, 8])
    ids = random_ids(rng, rng.randint(1, 30), allow_flat=False)
    dtypes = [torch.float32, torch.bfloat16, torch.int8, torch.float64]
    per_rank = [[] for _ in range(num_ranks)]
    for shard_id in ids:
        ndim = len(shard_id[1])
        holders = sorted(rng.sample(range(num_ranks), rng.randint(1, num_ranks)))
        main = rng.choice(holders + [None])  # None: no main replica anywhere
        dtype = rng.choice(dtypes)
        shape = [rng.choice([1, 2, 16]) for _ in range(ndim)]
        for rank in holders:
            if rng.random() < 0.1:  # another rank may report another size: lowest rank wins
                shape = [rng.choice([1, 3]) for _ in range(ndim)]
            replica = 0 if rank == main else rng.choice([1, (0, 1), (1, 0, 2)])
            if rank == main and rng.random() < 0.5:
                replica = (0, 0)
            per_rank[rank].append(sharded_tensor(shard_id, dtype, shape, replica))
    for shards in per_rank:
        rng.shuffle(shards)
    return per_rank


def main_replica_line(per_rank, ignore_groups):
    def describe(sh):
        shard_id = (sh.key, tuple(sh.global_offset), None)
        return [to_json_id(shard_id), int(exchange_utils._shard_size(sh)),
                exchange_utils.is_main_replica(sh.replica_id)]

    return {"num_ranks": len(per_rank), "ignore_groups": ignore_groups,
            "per_rank": [[describe(sh) for sh in shards] for shards in per_rank]}


@pytest.mark.parametrize("ignore_groups", [False, True])
def test_main_replicas_match_megatron_core_on_1000_random_problems(ignore_groups, monkeypatch):
    rng = random.Random(2024 + ignore_groups)
    problems = [random_main_replica_problem(rng) for _ in range(1000)]
    outputs = run_ckptctl("main-replicas", [main_replica_line(p, ignore_groups)
                                            for p in problems])
    for index, (per_rank, output) in enumerate(zip(problems, outputs)):
        expected = upstream_main_replicas(per_rank, ignore_groups, monkeypatch)
        got = output["distribution"]
        assert got is not None, f"problem {index}"
        assert ([(from_json_id(s), r) for s, r in got["main_rank_for_shard"]] ==
                list(expected.main_rank_for_shard.items())), f"problem {index}"
        assert ({from_json_id(s) for s in got["shards_in_this_group"]} ==
                set(expected.shards_in_this_group)), f"problem {index}"
        assert ({from_json_id(s): r for s, r in got["all_ranks_for_shard"]} ==
                dict(expected.all_ranks_for_shard)), f"problem {index}"


# Process groups: the same problems split into groups, each group's distribution computed by
# megatron-core with that group as the parallelization group (its all_gather returning the
# lists of the group's ranks, in ascending rank order as torch.distributed.new_group orders
# them), against `ckptctl plan main-replicas` with "groups".

def random_partition(rng, num_ranks):
    shape = rng.choice(["explicit", "read", "dp", "replica"])
    divisors = [k for k in range(1, num_ranks + 1) if num_ranks % k == 0]
    if shape == "read":
        k = rng.choice(divisors)
        return f"read-groups:{k}", [list(range(i, i + k)) for i in range(0, num_ranks, k)]
    if shape == "replica":
        k = rng.choice(divisors)
        return f"model-replica:{k}", [list(range(i, i + k)) for i in range(0, num_ranks, k)]
    if shape == "dp":
        k = rng.choice(divisors)
        return f"data-parallel:{k}", [list(range(i, num_ranks, k)) for i in range(k)]
    ranks = list(range(num_ranks))
    rng.shuffle(ranks)
    count = rng.randint(1, num_ranks)
    groups = [[r] for r in ranks[:count]]
    for r in ranks[count:]:
        rng.choice(groups).append(r)
    groups = sorted(sorted(g) for g in groups)
    return [list(g) for g in groups], groups


def upstream_writers(per_rank, groups, monkeypatch):
    """FullyParallelSaveStrategyWrapper's outcome per group: the distribution's rank saves each
    shard of shards_in_this_group; a group of one rank saves its main replicas itself."""
    writers = {}
    for group in groups:
        d = upstream_main_replicas([per_rank[r] for r in group], False, monkeypatch)
        if d is None:
            for sh in per_rank[group[0]]:
                if exchange_utils.is_main_replica(sh.replica_id):
                    writers[(sh.key, tuple(sh.global_offset), None)] = group[0]
            continue
        for shard_id, rank in d.main_rank_for_shard.items():
            writers[shard_id] = group[rank]
    return writers


@pytest.mark.parametrize("ignore_groups", [False, True])
def test_main_replicas_per_group_match_megatron_core_on_500_random_problems(ignore_groups,
                                                                             monkeypatch):
    rng = random.Random(1600 + ignore_groups)
    problems = []
    for _ in range(500):
        per_rank = random_main_replica_problem(rng)
        spec, groups = random_partition(rng, len(per_rank))
        problems.append((per_rank, spec, groups))
    lines = []
    for per_rank, spec, _ in problems:
        line = main_replica_line(per_rank, ignore_groups)
        line["groups"] = spec
        lines.append(line)
    outputs = run_ckptctl("main-replicas", lines)
    checked = 0
    for index, ((per_rank, spec, groups), output) in enumerate(zip(problems, outputs)):
        assert [g["ranks"] for g in output["groups"]] == groups, f"problem {index}: {spec}"
        for group, got in zip(groups, output["groups"]):
            expected = upstream_main_replicas([per_rank[r] for r in group], ignore_groups,
                                              monkeypatch)
            if expected is None:
                assert got["distribution"] is None, f"problem {index}"
                continue
            checked += 1
            got = got["distribution"]
            assert ([(from_json_id(s), r) for s, r in got["main_rank_for_shard"]] ==
                    list(expected.main_rank_for_shard.items())), f"problem {index} {group}"
            assert ({from_json_id(s) for s in got["shards_in_this_group"]} ==
                    set(expected.shards_in_this_group)), f"problem {index}"
            assert ({from_json_id(s): r for s, r in got["all_ranks_for_shard"]} ==
                    dict(expected.all_ranks_for_shard)), f"problem {index}"
        if not ignore_groups:
            writers = {from_json_id(s): r for s, r in output["writers"]}
            assert writers == upstream_writers(per_rank, groups, monkeypatch), f"problem {index}"
    assert checked > 300  # most groups have more than one rank


def test_groups_that_do_not_partition_the_ranks_fail_naming_rank_and_group():
    per_rank = [[[["w", [0], None], 4, True]], [], [], []]
    for groups, message in [([[0, 1], [2, 9]], "process group 1 names rank 9"),
                            ([[0, 1], [1, 2, 3]], "rank 1 is in process groups 0 and 1"),
                            ([[0, 1], [3]], "rank 2 is in no process group"),
                            ("read-groups:3", "does not divide the job's 4 ranks")]:
        line = {"num_ranks": 4, "per_rank": per_rank, "groups": groups}
        done = subprocess.run([CKPTCTL, "plan", "main-replicas"],
                              input=(json.dumps(line) + "\n").encode(), capture_output=True,
                              timeout=60)
        assert done.returncode != 0
        assert message in done.stderr.decode(), done.stderr.decode()


def test_groups_flag_applies_to_every_line_as_megatron_core_per_group(monkeypatch):
    rng = random.Random(16)
    problems = [p for p in (random_main_replica_problem(rng) for _ in range(300))
                if len(p) % 2 == 0]
    outputs = run_ckptctl("main-replicas", [main_replica_line(p, False) for p in problems],
                          extra=["--groups", "data-parallel:2"])
    for index, (per_rank, output) in enumerate(zip(problems, outputs)):
        groups = [list(range(i, len(per_rank), 2)) for i in range(2)]
        assert [g["ranks"] for g in output["groups"]] == groups
        writers = {from_json_id(s): r for s, r in output["writers"]}
        assert writers == upstream_writers(per_rank, groups, monkeypatch), f"problem {index}"
