#!/usr/bin/env bash
# Memory tier vs storage, same state, same run (issue 17): a coordinator and 4 workers on
# loopback announcing two hosts (hostA: workers 0-1, hostB: 2-3), 4 trainer_probe ranks of
# ELEMENTS int32 each (one row per rank). For each of storage (DIR/ckpt, fsynced) and memory
# (mem://bench, one replica on the other host) it prints, per rank and as the slowest rank:
#   save_blocking_s   Save called -> Save returned ("snapshotted": the trainer may go on)
#   save_durable_s    Save called -> WaitDurable returned (storage: committed on disk;
#                     memory: every replica holds its copy and the catalog committed it)
#   load_s            Load called -> Load returned (memory: read by the holders' workers,
#                     exchanged over Gloo; storage: read from the files, exchanged the same way)
# plus the replication's rate (state bytes over durable - blocking) and loopback TCP in the
# same run (4 streams, as many as ranks), and, for a memory save with persist_to (mem://benchp -> DIR/persisted):
#   persisted_s       the first rank's Save call -> the coordinator's persist_committed log line
#                     (the holders wrote every file into the staging dir, fsynced; committed)
# plus the disk's own limit in the same run: dd write (O_DIRECT, fsync) and read (O_DIRECT) of
# a file the size of the state, under DIR.
# Usage: bazel build -c opt //coordinator:ckpt_coordinator //worker:ckpt_worker
#          //tests:trainer_probe && tools/bench/memory_tier_bench.sh [ELEMENTS] [DIR]
# (WORKER_ARGS: extra worker flags, e.g. --communicator_cache_entries=0)
set -euo pipefail
ELEMENTS=${1:-33554432}   # 128 MiB per rank
DIR=${2:-$(mktemp -d /tmp/ckpt-memtier-bench.XXXXXX)}
BIN=${BIN:-bazel-bin}
mkdir -p "$DIR"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$BIN/coordinator/ckpt_coordinator" --listen=127.0.0.1:0 --address_file="$DIR/addr" \
  --checkpoint_root="$DIR" --log_level=info --load_algorithm=broadcast \
  >"$DIR/coordinator.out" 2>"$DIR/coordinator.err" &
PIDS+=($!)
while [ ! -s "$DIR/addr" ]; do sleep 0.05; done
ADDR=$(cat "$DIR/addr")
for w in 0 1 2 3; do
  host=hostA; [ "$w" -ge 2 ] && host=hostB
  "$BIN/worker/ckpt_worker" --coordinator="$ADDR" --listen="unix:$DIR/w$w.sock" --local_rank="$w" \
    --host="$host" --data_plane_address=127.0.0.1 --ready_file="$DIR/w$w.ready" \
    --memory_tier_bytes=$((ELEMENTS * 4 * 5)) --log_level=${WORKER_LOG_LEVEL:-warn} ${WORKER_ARGS:-} \
    >"$DIR/w$w.out" 2>"$DIR/w$w.err" &
  PIDS+=($!)
done
for w in 0 1 2 3; do while [ ! -s "$DIR/w$w.ready" ]; do sleep 0.05; done; done

# Runs 4 ranks of `mode` on `path` under job `job`; each rank's stdout lines are stamped with
# the seconds since the Save/Load call ("shared" marks it: the probe calls right after).
run_ranks() {
  local job=$1 mode=$2 path=$3
  shift 3
  local pids=()
  for r in 0 1 2 3; do
    ( "$BIN/tests/trainer_probe" --worker "unix:$DIR/w$r.sock" --job "$job" --rank "$r" \
        --world_size 4 --mode "$mode" --path "$path" --elements "$ELEMENTS" --global_rows 4 "$@" \
        | while IFS= read -r line; do echo "$(date +%s.%N) $line"; done >"$DIR/$job.r$r" ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}

# Slowest rank's seconds from "shared" to the first line starting with $2, over job $1's ranks.
slowest() {
  local job=$1 event=$2 worst=0
  for r in 0 1 2 3; do
    local f="$DIR/$job.r$r"
    grep -q " result 0 " "$f" || { echo "rank $r of $job failed: $(grep result "$f")" >&2; exit 1; }
    local t0 t1
    t0=$(awk '$2 == "shared" {print $1; exit}' "$f")
    t1=$(awk -v e="$event" '$2 == e {print $1; exit}' "$f")
    worst=$(echo "$worst $t0 $t1" | awk '{d = $3 - $2; print (d > $1 ? d : $1)}')
  done
  printf "%.3f" "$worst"
}

MIB=$((ELEMENTS * 4 * 4 / 1048576))
echo "state: 4 ranks x $((ELEMENTS * 4 / 1048576)) MiB = $MIB MiB; dir $DIR"
run_ranks store save "$DIR/ckpt"
echo "storage save: blocking_s=$(slowest store snapshotted) durable_s=$(slowest store result)"
run_ranks mem save mem://bench
echo "memory save:  blocking_s=$(slowest mem snapshotted) durable_s=$(slowest mem result)" \
  "(durable = replicated on the other host)"
# Replication against its limit: every rank's file (1/4 of the state) crosses loopback TCP once,
# four streams at once (one per rank), between snapshotted and durable of the slowest rank.
REPL_S=$(echo "$(slowest mem result) $(slowest mem snapshotted)" | awk '{print $1 - $2}')
LOOP=$(cd "$(dirname "$0")" && python3 -c "import transfer_bench as t; print('%.2f' % t.loopback_gbps(4, $((ELEMENTS * 4 * 4))))")
echo "replication: $MIB MiB in ${REPL_S} s = $(echo "$REPL_S" | awk -v b=$((ELEMENTS * 16)) '{printf "%.2f", b / $1 / 1e9}') GB/s;" \
  "loopback TCP, 4 streams, same bytes: $LOOP GB/s"
run_ranks storeload load "$DIR/ckpt"
echo "storage load: load_s=$(slowest storeload result)"
run_ranks memload load mem://bench
echo "memory load:  load_s=$(slowest memload result)"
# The next memory save of the same ranks: the workers reuse the first one's communicator
# (issue 40; --communicator_cache_entries=0 makes them join anew).
run_ranks mem2 save mem://bench2
REPL2_S=$(echo "$(slowest mem2 result) $(slowest mem2 snapshotted)" | awk '{print $1 - $2}')
echo "memory save again: blocking_s=$(slowest mem2 snapshotted) durable_s=$(slowest mem2 result)" \
  "replication: ${REPL2_S} s = $(echo "$REPL2_S" | awk -v b=$((ELEMENTS * 16)) '{printf "%.2f", b / $1 / 1e9}') GB/s"

# Background persistence: the earliest Save call -> the coordinator's persist_committed line.
run_ranks memp save mem://benchp --persist_to "$DIR/persisted"
echo "memory save with persist_to: blocking_s=$(slowest memp snapshotted)" \
  "replicated_s=$(slowest memp result)"
while ! grep -q "persist_committed checkpoint=mem://benchp" "$DIR/coordinator.err"; do
  if grep -q "persist_failed checkpoint=mem://benchp" "$DIR/coordinator.err"; then
    echo "persistence failed: $(grep persist_failed "$DIR/coordinator.err")" >&2
    exit 1
  fi
  sleep 0.05
done
start=$(for r in 0 1 2 3; do awk '$2 == "shared" {print $1; exit}' "$DIR/memp.r$r"; done | sort -n | head -1)
stamp=$(grep "persist_committed checkpoint=mem://benchp" "$DIR/coordinator.err" | head -1 | cut -d' ' -f1)
committed=$(date -d "$stamp" +%s.%N)
echo "memory persisted: persisted_s=$(echo "$start $committed" | awk '{printf "%.3f", $2 - $1}')" \
  "(Save call -> committed at $DIR/persisted)"

# The disk's limit in this run: a file the size of the state, O_DIRECT, fsynced.
COUNT=$(( (MIB + 63) / 64 ))
t0=$(date +%s.%N)
dd if=/dev/zero of="$DIR/dd.bin" bs=64M count="$COUNT" oflag=direct conv=fsync status=none
t1=$(date +%s.%N)
dd if="$DIR/dd.bin" of=/dev/null bs=64M iflag=direct status=none
t2=$(date +%s.%N)
rm -f "$DIR/dd.bin"
echo "disk (dd, ${COUNT}x64 MiB, O_DIRECT): write_GBps=$(echo "$t0 $t1 $COUNT" |
  awk '{printf "%.2f", $3 * 67108864 / ($2 - $1) / 1e9}')" \
  "read_GBps=$(echo "$t1 $t2 $COUNT" | awk '{printf "%.2f", $3 * 67108864 / ($2 - $1) / 1e9}')"
