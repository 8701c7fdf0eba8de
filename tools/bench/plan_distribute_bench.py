#!/usr/bin/env python3
"""Times `ckptctl plan distribute` end to end on 200,000 shards x 512 ranks.

Generates the input (one JSON line, ~22.5 MB: ids ["layerN.weight", [o, 0], null], 1-8 random
holders each, random sizes, 10 % of the shards cross-group; seed fixed), runs the command
--reps times (process start to output file written, as the wall time of the child), and prints
the median, min and max, the distribution-only time (the output's plan_seconds, median), the
output's SHA-256 without plan_seconds (to compare builds), the command's CPU time (user +
system, median; what a loaded machine's wall time hides) and the machine's load average.

  bazel build -c opt //tools:ckptctl
  python3 tools/bench/plan_distribute_bench.py --ckptctl bazel-bin/tools/ckptctl
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckptctl", default="bazel-bin/tools/ckptctl")
    parser.add_argument("--shards", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=16)
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
        print(f"input: {args.shards} shards x {args.ranks} ranks, "
              f"{os.path.getsize(src) / 1e6:.1f} MB; output {len(out) / 1e6:.1f} MB, "
              f"sha256 (plan_seconds masked) {digest}")
    ms = [w * 1e3 for w in walls]
    print(f"end to end: median {statistics.median(ms):.1f} ms "
          f"(min {min(ms):.1f}, max {max(ms):.1f}, {args.reps} runs)")
    print(f"CPU (user + system) of the command: median {statistics.median(cpus) * 1e3:.1f} ms")
    print(f"distribution only (plan_seconds): median {statistics.median(plans) * 1e3:.1f} ms")
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
