#!/usr/bin/env python3
"""Times `ckptctl plan distribute` end to end on 200,000 shards x 512 ranks.

Generates the input (one JSON line, ~22.5 MB: ids ["layerN.weight", [o, 0], null], 1-8 random
holders each, random sizes, 10 % of the shards cross-group; seed fixed), runs the command
--reps times (process start to output file written, as the wall time of the child), and prints
the median, min and max, the distribution-only time (the output's plan_seconds, median), the
output's SHA-256 without plan_seconds (to compare builds), the command's CPU time (user +
system, median; what a loaded machine's wall time hides) and the machine's load average.

With --megatron PYTHON (an interpreter with megatron-core, e.g. .venv/bin/python) it also runs
the peer in the same run: megatron-core's own exchange_utils.distribute_shards_to_ranks on the
same input (--megatron-reps times, timing the function alone and, separately, json.load + the
function), and checks that its assignment is exactly ckptctl's (same shards, same ranks, same
order).

  bazel build -c opt //tools:ckptctl
  python3 tools/bench/plan_distribute_bench.py --ckptctl bazel-bin/tools/ckptctl \
      --megatron .venv/bin/python
"""
import argparse
import hashlib
import json
import os
import random
import re
import resource
import statistics
import subprocess
import tempfile
import time


def make_input(shards, ranks, seed):
    rng = random.Random(seed)
    per_layer = 200
    ids = [[f"layer{i // per_layer}.weight", [(i % per_layer) * 128, 0], None]
           for i in range(shards)]
    line = {
        "num_ranks": ranks,
        "shard_to_ranks": [[i, rng.sample(range(ranks), rng.randint(1, 8))] for i in ids],
        "shard_to_size": [[i, rng.choice([4096, 65536, 1 << 20, 3 << 20])] for i in ids],
        "cross_group": [i for i in ids if rng.random() < 0.1],
    }
    return json.dumps(line) + "\n"


# Run by the --megatron interpreter: times megatron-core's distribution on the input line and
# writes its assignment as ckptctl writes it (compact JSON, visiting order).
PEER_SCRIPT = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
from megatron.core.dist_checkpointing.exchange_utils import distribute_shards_to_ranks
src, dst, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def key(i):
    return (i[0], tuple(i[1]), None if i[2] is None else tuple(i[2]))
times, totals = [], []
for _ in range(reps):
    start = time.perf_counter()
    with open(src) as f:
        line = json.load(f)
    s2r = {key(i): r for i, r in line["shard_to_ranks"]}
    s2s = {key(i): b for i, b in line["shard_to_size"]}
    cross = {key(i) for i in line.get("cross_group", [])}
    begin = time.perf_counter()
    out = distribute_shards_to_ranks(s2r, s2s, line["num_ranks"], cross)
    end = time.perf_counter()
    times.append(end - begin)
    totals.append(end - start)
def unkey(k):
    return [k[0], list(k[1]), None if k[2] is None else list(k[2])]
with open(dst, "w") as f:
    json.dump([[unkey(k), r] for k, r in out.items()], f, separators=(",", ":"))
print(json.dumps({"function": times, "with_json_load": totals}))
"""


def run_peer(python, src, reps, tmp, ours):
    """Times megatron-core on `src`; checks its assignment equals `ours` (ckptctl's)."""
    dst = os.path.join(tmp, "peer.json")
    done = subprocess.run([python, "-c", PEER_SCRIPT, src, dst, str(reps)], check=True,
                          capture_output=True, text=True)
    times = json.loads(done.stdout.strip().splitlines()[-1])
    with open(dst) as f:
        peer = json.load(f)
    same = peer == ours
    fn = statistics.median(times["function"]) * 1e3
    total = statistics.median(times["with_json_load"]) * 1e3
    print(f"megatron-core distribute_shards_to_ranks, same input, same run: median {fn:.0f} ms "
          f"(json.load + function {total:.0f} ms, {reps} runs); assignment identical to "
          f"ckptctl's: {same}")
    if not same:
        raise SystemExit("megatron-core's assignment differs from ckptctl's")
    return fn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckptctl", default="bazel-bin/tools/ckptctl")
    parser.add_argument("--shards", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--megatron", help="python with megatron-core: also time the peer")
    parser.add_argument("--megatron-reps", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="plan_bench_") as tmp:
        src = os.path.join(tmp, "in.jsonl")
        dst = os.path.join(tmp, "out.jsonl")
        with open(src, "w") as f:
            f.write(make_input(args.shards, args.ranks, args.seed))
        cmd = [args.ckptctl, "plan", "distribute", "--input", src, "--output", dst]
        subprocess.run(cmd, check=True)  # warm the page cache and the binary
        walls, cpus, plans = [], [], []
        for _ in range(args.reps):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, check=True)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            with open(dst) as f:
                out = f.read()
            plans.append(float(re.search(r'"plan_seconds":([^}]*)}', out).group(1)))
        body = re.sub(r'"plan_seconds":[^}]*}', '"plan_seconds":_}', out)
        digest = hashlib.sha256(body.encode()).hexdigest()[:16]
        peer_ms = None
        if args.megatron:
            ours = json.loads(out)["assignment"]
            peer_ms = run_peer(args.megatron, src, args.megatron_reps, tmp, ours)
        print(f"input: {args.shards} shards x {args.ranks} ranks, "
              f"{os.path.getsize(src) / 1e6:.1f} MB; output {len(out) / 1e6:.1f} MB, "
              f"sha256 (plan_seconds masked) {digest}")
    ms = [w * 1e3 for w in walls]
    print(f"end to end: median {statistics.median(ms):.1f} ms "
          f"(min {min(ms):.1f}, max {max(ms):.1f}, {args.reps} runs)")
    print(f"CPU (user + system) of the command: median {statistics.median(cpus) * 1e3:.1f} ms")
    print(f"distribution only (plan_seconds): median {statistics.median(plans) * 1e3:.1f} ms")
    if peer_ms is not None:
        print(f"speed-up over megatron-core's function alone: end to end "
              f"{peer_ms / statistics.median(ms):.0f}x, distribution alone "
              f"{peer_ms / (statistics.median(plans) * 1e3):.0f}x")
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
