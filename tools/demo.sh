#!/usr/bin/env bash
# The main job, one command: a local ckpt cluster (a coordinator and 4 worker daemons on
# loopback) and a GPT-style training job of 4 ranks (TP=2 x DP=2, ZeRO-1 optimizer state)
# that saves through the cluster; the checkpoint is then loaded into TP=4 x DP=1 and into a
# 3-rank uneven layout (every element verified by the trainers), resharded offline, verified,
# inspected and exported to safetensors. Ends with a table of bytes / seconds / GB/s per step,
# each next to its limit measured in the same run (dd write for a save, a memcpy into touched
# memory for the snapshot Save() waits for, dd read for a load, the read+write floor
# 1/(1/read + 1/write) for a reshard or export), also written as JSON to results/table.json
# (kept with --keep), and stops every process it started.
#
#   tools/demo.sh [--size small|medium|large] [--workdir DIR] [--keep] [--bin-dir DIR]
#                 [--load-algorithm A]
#
# Exit status 0 only when every step succeeded.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: tools/demo.sh [--size small|medium|large] [--workdir DIR] [--keep] [--bin-dir DIR]
                     [--load-algorithm A]

Starts a ckpt coordinator and 4 workers on loopback, runs 4 gpt_trainer ranks (TP=2 x DP=2)
that save a GPT-style sharded checkpoint through them, loads it into TP=4 x DP=1 and a 3-rank
uneven layout (verifying every element), reshards it offline (ckptctl reshard), verifies,
inspects and exports it, copies it to s3:// on a local Swift and back (when installed), and prints
bytes / seconds / GB/s per step next to its limit measured
in the same run (dd, memcpy, the read+write floor).

  --size S      small (~2 MB, for CI), medium (~256 MB) or large (~1.4 GB, the default)
  --workdir DIR where checkpoints, logs and the dd test file go (default: a new directory
                under $TMPDIR or /tmp, removed at the end unless --keep). Put it on the disk
                you want measured.
  --keep        keep the checkpoints, export and logs
  --bin-dir DIR take the binaries from DIR/{coordinator/ckpt_coordinator,worker/ckpt_worker,
                tools/ckptctl,examples/gpt_trainer,examples/gpt_tool} (e.g. bazel-bin or a
                test's runfiles) instead of running tools/install_deps.sh and bazel build
  --load-algorithm A  how loads get the bytes to the ranks: auto (default: direct on one host,
                broadcast across hosts), broadcast, overlap_all_to_all, gather_rounds,
                gather_object (each stored byte read once and exchanged between workers), or
                direct (every worker reads what its rank needs itself)
  --help        this text
EOF
}

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=large
WORKDIR=""
KEEP=0
BIN_DIR=""
LOAD_ALGORITHM=auto
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) SIZE="${2:-}"; shift 2 ;;
    --workdir) WORKDIR="${2:-}"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --bin-dir) BIN_DIR="${2:-}"; shift 2 ;;
    --load-algorithm) LOAD_ALGORITHM="${2:-}"; shift 2 ;;
    --help | -h) usage; exit 0 ;;
    *) echo "demo: unknown argument \"$1\" (see --help)" >&2; exit 2 ;;
  esac
done
case "$SIZE" in
  small) MODEL_FLAGS=(--layers 2 --hidden 64 --vocab 256); POOL_MIB=16 ;;
  medium) MODEL_FLAGS=(--model-bytes $((256 * 1024 * 1024))); POOL_MIB=128 ;;
  large) MODEL_FLAGS=(--model-bytes $((1536 * 1024 * 1024))); POOL_MIB=512 ;;
  *) echo "demo: --size must be small, medium or large, got \"$SIZE\"" >&2; exit 2 ;;
esac

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[demo] error: %s\n' "$*" >&2; exit 1; }

# ---- Everything started is stopped on any exit -----------------------------------------------
# Each daemon and trainer runs in its own process group (setsid), recorded here; the trap sends
# SIGTERM to every group, waits briefly, then SIGKILLs what is left.
PGIDS=()
SOCKDIR=""
S3_SERVER_DIR=""  # a Swift started for the object-store step (stopped on exit)
CREATED_WORKDIR=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local g
  for g in "${PGIDS[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for g in "${PGIDS[@]}"; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for g in "${PGIDS[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  wait 2>/dev/null
  [[ -n "$SOCKDIR" ]] && rm -rf "$SOCKDIR"
  [[ -n "$S3_SERVER_DIR" ]] &&
    /usr/bin/python3 "$REPO/storage/s3/testing/swift_server.py" stop --dir "$S3_SERVER_DIR" \
      >/dev/null 2>&1
  # Without --keep the checkpoints go; the logs stay when something failed (or when the
  # workdir was given), so the failure can be read.
  if [[ -n "$WORKDIR" && -d "$WORKDIR" ]]; then
    if [[ $KEEP -eq 1 ]]; then
      echo "demo: kept $WORKDIR (checkpoints in ckpt/, logs in logs/)"
    elif [[ $CREATED_WORKDIR -eq 1 && $rc -eq 0 ]]; then
      rm -rf "$WORKDIR"
    else
      rm -rf "$WORKDIR/ckpt" "$WORKDIR/export" "$WORKDIR/dd.bin" "$WORKDIR/bin"
      echo "demo: logs in $WORKDIR/logs"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts "$@" in a new process group with stdout/stderr to files; sets STARTED_PID.
start_group() {
  local out="$1" err="$2"
  shift 2
  setsid "$@" >"$out" 2>"$err" </dev/null &
  STARTED_PID=$!
  PGIDS+=("$STARTED_PID")
}

# Waits up to $2 seconds for file $1 to be non-empty while process $3 lives.
wait_for_file() {
  local file="$1" seconds="$2" pid="$3"
  for _ in $(seq $((seconds * 10))); do
    [[ -s "$file" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# ---- Install and build ------------------------------------------------------------------------
if [[ -z "$BIN_DIR" ]]; then
  log "installing what is missing (tools/install_deps.sh)"
  "$REPO/tools/install_deps.sh" || die "tools/install_deps.sh failed"
  log "building (bazel)"
  (cd "$REPO" && bazel build //coordinator:ckpt_coordinator //worker:ckpt_worker //tools:ckptctl \
    //examples:gpt_trainer //examples:gpt_tool) || die "bazel build failed"
  BIN_DIR="$REPO/bazel-bin"
fi
COORDINATOR="$BIN_DIR/coordinator/ckpt_coordinator"
WORKER="$BIN_DIR/worker/ckpt_worker"
CKPTCTL="$BIN_DIR/tools/ckptctl"
TRAINER="$BIN_DIR/examples/gpt_trainer"
GPT_TOOL="$BIN_DIR/examples/gpt_tool"
LAYOUTS="$REPO/examples/layouts"
for b in "$COORDINATOR" "$WORKER" "$CKPTCTL" "$TRAINER" "$GPT_TOOL"; do
  [[ -x "$b" ]] || die "missing binary $b"
done
for l in tp2dp2 tp4dp1 uneven3; do
  [[ -f "$LAYOUTS/$l.json" ]] || die "missing layout $LAYOUTS/$l.json"
done
command -v python3 >/dev/null || die "python3 is needed to aggregate the results"

# ---- Directories ------------------------------------------------------------------------------
if [[ -z "$WORKDIR" ]]; then
  WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo.XXXXXX")" || die "cannot create a workdir"
  CREATED_WORKDIR=1
fi
mkdir -p "$WORKDIR" || die "cannot create $WORKDIR"
WORKDIR="$(cd "$WORKDIR" && pwd)"
rm -rf "$WORKDIR/ckpt" "$WORKDIR/export" "$WORKDIR/logs" "$WORKDIR/results" "$WORKDIR/bin"
mkdir -p "$WORKDIR/ckpt" "$WORKDIR/logs" "$WORKDIR/results"
CK="$WORKDIR/ckpt"
LOGS="$WORKDIR/logs"
RESULTS="$WORKDIR/results"
# Unix socket paths must stay under 108 bytes, so sockets get their own short directory.
SOCKDIR="$(mktemp -d /tmp/ckpt-demo-sock.XXXXXX)" || die "cannot create a socket directory"
log "size $SIZE, workdir $WORKDIR"

# A private copy of the binaries: a concurrent `bazel build` in the same workspace may replace
# bazel-bin's files while the demo runs.
mkdir -p "$WORKDIR/bin" || die "cannot create $WORKDIR/bin"
for b in COORDINATOR WORKER CKPTCTL TRAINER GPT_TOOL; do
  cp -L "${!b}" "$WORKDIR/bin/" || die "cannot copy ${!b}"
  printf -v "$b" '%s' "$WORKDIR/bin/$(basename "${!b}")"
done

FAILED=()
fail_step() {
  FAILED+=("$1")
  printf '[demo] FAILED: %s\n' "$1" >&2
}

# ---- Object store (issue 43): a one-node Swift, started before the cluster -------------------
# When Debian's Swift with s3api is installed (tools/install_deps.sh installs it), a one-node
# Swift on loopback stores its objects on this same disk. The daemons and ckptctl find it
# through the standard AWS environment variables, as a user's would; the coordinator accepts
# checkpoints under s3://ckpt-demo too.
S3_ROOT_FLAGS=()
S3_STATE="skipped"  # skipped | started | failed
if /usr/bin/python3 -c 'import swift.common.middleware.s3api' 2>/dev/null; then
  S3_SERVER_DIR="$WORKDIR/s3server"
  log "object store: a one-node Swift with s3api on loopback"
  if /usr/bin/python3 "$REPO/storage/s3/testing/swift_server.py" start --dir "$S3_SERVER_DIR" \
    --bucket ckpt-demo --owner-pid $$ >"$RESULTS/s3-server.json" 2>"$LOGS/s3-server.log"; then
    eval "$(python3 -c '
import json, shlex, sys
j = json.load(open(sys.argv[1]))
for k, v in (("AWS_ACCESS_KEY_ID", j["access_key_id"]),
             ("AWS_SECRET_ACCESS_KEY", j["secret_access_key"]),
             ("AWS_REGION", j["region"]), ("AWS_ENDPOINT_URL", j["endpoint"])):
    print(f"export {k}={shlex.quote(v)}")' "$RESULTS/s3-server.json")"
    S3_ROOT_FLAGS=(--checkpoint_root=s3://ckpt-demo)
    S3_STATE="started"
  else
    S3_STATE="failed"
  fi
fi

# ---- The cluster: a coordinator and 4 workers on loopback ------------------------------------
# Port 0: the OS picks a free port; the coordinator writes the address it bound to a file.
# Loopback only, so plaintext (no certificates); checkpoints only under $CK.
start_group "$LOGS/coordinator.out" "$LOGS/coordinator.log" "$COORDINATOR" \
  --listen=127.0.0.1:0 --address_file="$SOCKDIR/coordinator.address" --log_level=info \
  --checkpoint_root="$CK" "${S3_ROOT_FLAGS[@]}" \
  --arrival_deadline_ms=120000 --load_algorithm="$LOAD_ALGORITHM"
COORD_PID=$STARTED_PID
wait_for_file "$SOCKDIR/coordinator.address" 30 "$COORD_PID" ||
  die "the coordinator did not start: $(tail -3 "$LOGS/coordinator.log")"
ADDRESS="$(tr -d '[:space:]' <"$SOCKDIR/coordinator.address")"
log "coordinator on $ADDRESS (pid $COORD_PID)"
NUM_WORKERS=4
# Each worker's save pool is mapped and touched once at start (--host_pool_prefault), as a
# long-running worker's is after its first save, sized to hold its rank's part of the state
# (about a quarter of it), so the save below copies into touched memory.
for w in $(seq 0 $((NUM_WORKERS - 1))); do
  start_group "$LOGS/worker$w.out" "$LOGS/worker$w.log" "$WORKER" --coordinator="$ADDRESS" \
    --listen="unix:$SOCKDIR/w$w.sock" --local_rank="$w" --ready_file="$SOCKDIR/w$w.ready" \
    --host_pool_bytes=$((POOL_MIB << 20)) --host_pool_prefault --log_level=info
  WORKER_PIDS[$w]=$STARTED_PID
done
for w in $(seq 0 $((NUM_WORKERS - 1))); do
  wait_for_file "$SOCKDIR/w$w.ready" 30 "${WORKER_PIDS[$w]}" ||
    die "worker $w did not register: $(tail -3 "$LOGS/worker$w.log")"
done
log "$NUM_WORKERS workers registered (sockets in $SOCKDIR)"

# ---- Trainer jobs ------------------------------------------------------------------------------
# start_job NAME WORLD LAYOUT ACTION...: starts WORLD gpt_trainer ranks the way torchrun would
# (RANK, WORLD_SIZE, LOCAL_RANK in the environment; CKPT_JOB and CKPT_WORKER_ADDRESS name the
# job and the rank's local worker); each rank's JSON lines go to $RESULTS/NAME.rankR.jsonl.
# wait_job NAME WORLD: waits for them; non-zero when any rank failed. run_job: both.
declare -A JOB_PIDS
start_job() {
  local name="$1" world="$2" layout="$3" r
  shift 3
  for r in $(seq 0 $((world - 1))); do
    start_group "$RESULTS/$name.rank$r.jsonl" "$LOGS/$name.rank$r.err" env \
      RANK="$r" WORLD_SIZE="$world" LOCAL_RANK="$r" CKPT_JOB="$name" \
      CKPT_WORKER_ADDRESS="unix:$SOCKDIR/w$((r % NUM_WORKERS)).sock" \
      "$TRAINER" --layout "$layout" "${MODEL_FLAGS[@]}" --arrival-timeout-s 120 "$@"
    JOB_PIDS[$name.$r]=$STARTED_PID
  done
}
wait_job() {
  local name="$1" world="$2" r rc=0
  for r in $(seq 0 $((world - 1))); do
    if ! wait "${JOB_PIDS[$name.$r]}"; then
      rc=1
      printf '[demo] %s rank %d failed: %s\n' "$name" "$r" \
        "$(tail -2 "$LOGS/$name.rank$r.err" | tr '\n' ' ')" >&2
    fi
  done
  return $rc
}
run_job() {
  start_job "$@"
  wait_job "$1" "$2"
}
# wait_ready NAME WORLD: until every rank printed its "ready" line (attached to the job).
wait_ready() {
  local name="$1" world="$2" r
  for r in $(seq 0 $((world - 1))); do
    for _ in $(seq 600); do
      grep -q '"event":"ready"' "$RESULTS/$name.rank$r.jsonl" 2>/dev/null && break
      kill -0 "${JOB_PIDS[$name.$r]}" 2>/dev/null || return 1
      sleep 0.1
    done
    grep -q '"event":"ready"' "$RESULTS/$name.rank$r.jsonl" 2>/dev/null || return 1
  done
}

# drop_cache STEP CKPT...: evicts the checkpoints' files from the page cache before STEP reads
# them (per file: sync, then dd iflag=nocache, i.e. posix_fadvise DONTNEED; no system-wide
# effect), then checks with fincore(1) that it worked and records the bytes still resident in
# $RESULTS/STEP.resident; the table prints them, so a step measured partly from memory says so.
drop_cache() {
  local step="$1" f resident=0 r
  shift
  for f in $(find "$@" -type f 2>/dev/null); do
    sync "$f" 2>/dev/null
    dd if="$f" iflag=nocache count=0 status=none 2>/dev/null
    r=$(fincore --bytes --noheadings --output RES "$f" 2>/dev/null | tr -d ' ')
    if [[ -z "$r" ]]; then
      resident=unknown
      break
    fi
    resident=$((resident + r))
  done
  echo "$resident" >"$RESULTS/$step.resident"
}

# timed NAME CMD...: runs CMD with output in $LOGS/NAME.log, records its wall seconds in
# $RESULTS/NAME.seconds (and $RESULTS/NAME.ok on success); returns its status.
timed() {
  local name="$1"
  shift
  local start end rc
  start=$(date +%s.%N)
  "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.6f}')" >"$RESULTS/$name.seconds"
  [[ $rc -eq 0 ]] && touch "$RESULTS/$name.ok"
  return $rc
}

SAVED="$CK/gpt-tp2dp2"
log "save: 4 ranks, TP=2 x DP=2, through the cluster -> $SAVED"
run_job save-tp2dp2 4 "$LAYOUTS/tp2dp2.json" --save "$SAVED" || fail_step "save (TP=2 x DP=2)"

# The checkpoint's stored bytes size the disk test: same total as the checkpoint.
CKPT_BYTES=$(du -sb "$SAVED/data" 2>/dev/null | cut -f1)
CKPT_BYTES=${CKPT_BYTES:-0}

# ---- Disk bandwidth, dd-style with O_DIRECT, same total size as the checkpoint -------------
BS=$((4 * 1024 * 1024))
COUNT=$(((CKPT_BYTES + BS - 1) / BS))
[[ $COUNT -lt 1 ]] && COUNT=1
DD_FILE="$WORKDIR/dd.bin"
DD_NOTE="O_DIRECT"
log "disk: dd $COUNT x 4 MiB write (oflag=direct conv=fsync) and read (iflag=direct)"
if ! timed dd-write dd if=/dev/zero of="$DD_FILE" bs=4M count="$COUNT" oflag=direct conv=fsync; then
  DD_NOTE="buffered + fsync (this filesystem refuses O_DIRECT)"
  timed dd-write dd if=/dev/zero of="$DD_FILE" bs=4M count="$COUNT" conv=fsync ||
    fail_step "dd write"
fi
if [[ "$DD_NOTE" == "O_DIRECT" ]]; then
  timed dd-read dd if="$DD_FILE" of=/dev/null bs=4M iflag=direct || fail_step "dd read"
else
  timed dd-read dd if="$DD_FILE" of=/dev/null bs=4M || fail_step "dd read"
fi
# Loads read with several readers at once (ranks, I/O threads), which a virtual disk may serve
# faster than one stream: the read limit is the better of one dd and eight dd's reading an
# eighth each.
read_parallel() {
  local q=$(((COUNT + 7) / 8)) i flag="" pids=() rc=0
  [[ "$DD_NOTE" == "O_DIRECT" ]] && flag="iflag=direct"
  for i in 0 1 2 3 4 5 6 7; do
    dd if="$DD_FILE" of=/dev/null bs=4M skip=$((i * q)) count=$q $flag status=none &
    pids+=($!)
  done
  # Only these eight: a bare `wait` would also wait for the cluster's daemons.
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  return $rc
}
drop_cache dd-read8 "$DD_FILE"
timed dd-read8 read_parallel || fail_step "dd read (8 readers)"
rm -f "$DD_FILE"
DD_BYTES=$((COUNT * BS))

# ---- Verify what the save wrote -----------------------------------------------------------------
log "check: every element of the saved checkpoint (offline reader, TP=2 x DP=2 pieces)"
drop_cache check-saved "$SAVED"
timed check-saved "$GPT_TOOL" check "$SAVED" --layout "$LAYOUTS/tp2dp2.json" ||
  fail_step "content check of the saved checkpoint: $(tail -1 "$LOGS/check-saved.log")"
log "ckptctl verify $SAVED"
drop_cache verify "$SAVED"
timed verify "$CKPTCTL" verify "$SAVED" || fail_step "ckptctl verify: $(tail -1 "$LOGS/verify.log")"

# ---- Loads through the cluster into other layouts ---------------------------------------------
# The 3-rank job reuses the same cluster: its ranks attach to workers 0-2 and worker 3 simply
# takes no part in that job's operations, as on a host where a job uses fewer GPUs.
log "load: 4 ranks, TP=4 x DP=1 <- $SAVED (every element verified)"
drop_cache load-tp4dp1 "$SAVED"
run_job load-tp4dp1 4 "$LAYOUTS/tp4dp1.json" --load "$SAVED" || fail_step "load into TP=4 x DP=1"
log "load: 3 ranks, uneven <- $SAVED (every element verified)"
drop_cache load-uneven3 "$SAVED"
run_job load-uneven3 3 "$LAYOUTS/uneven3.json" --load "$SAVED" || fail_step "load into 3 ranks"
# Into the saved layout again: both data-parallel replicas need the weights (the ZeRO-style
# optimizer shards are split over them), which are read from storage once and exchanged.
log "load: 4 ranks, TP=2 x DP=2 <- $SAVED (every element verified)"
drop_cache load-tp2dp2 "$SAVED"
run_job load-tp2dp2 4 "$LAYOUTS/tp2dp2.json" --load "$SAVED" || fail_step "load into TP=2 x DP=2"

# ---- Operator-requested save and load of a running job (ckptctl -> coordinator -> Poll) -----
# A 4-rank TP=4 x DP=1 job trains (one Poll per 20 ms step); the operator asks for a save (taken
# at the ranks' next Poll; the trainers then overwrite their tensors, so the check below proves
# the snapshot) and then for a load of the TP=2 x DP=2 checkpoint, which must bring every element
# back (the trainers verify it).
OPSAVED="$CK/gpt-tp4dp1-operator"
log "operator: ckptctl save/load of a running 4-rank TP=4 x DP=1 job (trainers Poll each step)"
start_job ops-tp4dp1 4 "$LAYOUTS/tp4dp1.json" --step-ms 20 --poll-steps 6000 --poll-ops 2
if wait_ready ops-tp4dp1 4; then
  timed operator-save "$CKPTCTL" save --coordinator "$ADDRESS" --job ops-tp4dp1 "$OPSAVED" ||
    fail_step "ckptctl save: $(tail -1 "$LOGS/operator-save.log")"
  drop_cache operator-load "$SAVED"
  timed operator-load "$CKPTCTL" load --coordinator "$ADDRESS" --job ops-tp4dp1 "$SAVED" ||
    fail_step "ckptctl load: $(tail -1 "$LOGS/operator-load.log")"
else
  fail_step "the ops-tp4dp1 trainers did not come up"
fi
if [[ ! -f "$RESULTS/operator-save.ok" || ! -f "$RESULTS/operator-load.ok" ]]; then
  # The trainers would poll until their step limit: stop them now.
  for r in 0 1 2 3; do kill -TERM -- "-${JOB_PIDS[ops-tp4dp1.$r]}" 2>/dev/null; done
fi
if ! wait_job ops-tp4dp1 4; then
  fail_step "operator-requested save/load in the trainers"
elif [[ -f "$RESULTS/operator-save.ok" ]]; then
  timed check-operator "$GPT_TOOL" check "$OPSAVED" --layout "$LAYOUTS/tp4dp1.json" ||
    fail_step "content check of the operator's save: $(tail -1 "$LOGS/check-operator.log")"
fi

# ---- Offline reshard, verify, inspect, export --------------------------------------------------
for l in tp4dp1 uneven3; do
  log "ckptctl reshard $SAVED -> $CK/gpt-$l (offline, layout $l.json)"
  drop_cache "reshard-$l" "$SAVED"
  if timed "reshard-$l" "$CKPTCTL" reshard "$SAVED" "$CK/gpt-$l" --layout "$LAYOUTS/$l.json"; then
    timed "check-$l" "$GPT_TOOL" check "$CK/gpt-$l" --layout "$LAYOUTS/$l.json" ||
      fail_step "content check of the $l reshard: $(tail -1 "$LOGS/check-$l.log")"
    timed "verify-$l" "$CKPTCTL" verify "$CK/gpt-$l" ||
      fail_step "ckptctl verify of the $l reshard: $(tail -1 "$LOGS/verify-$l.log")"
  else
    fail_step "ckptctl reshard to $l: $(tail -1 "$LOGS/reshard-$l.log")"
  fi
done
# The same reshard executed by the running cluster's workers (the coordinator plans and commits).
log "ckptctl reshard $SAVED -> $CK/gpt-cluster-tp4dp1 --coordinator (on the 4 workers)"
drop_cache reshard-cluster "$SAVED"
if timed reshard-cluster "$CKPTCTL" reshard "$SAVED" "$CK/gpt-cluster-tp4dp1" \
    --layout "$LAYOUTS/tp4dp1.json" --coordinator "$ADDRESS"; then
  timed check-cluster "$GPT_TOOL" check "$CK/gpt-cluster-tp4dp1" --layout "$LAYOUTS/tp4dp1.json" ||
    fail_step "content check of the cluster reshard: $(tail -1 "$LOGS/check-cluster.log")"
  timed verify-cluster "$CKPTCTL" verify "$CK/gpt-cluster-tp4dp1" ||
    fail_step "ckptctl verify of the cluster reshard: $(tail -1 "$LOGS/verify-cluster.log")"
else
  fail_step "ckptctl reshard --coordinator: $(tail -1 "$LOGS/reshard-cluster.log")"
fi
log "ckptctl inspect $SAVED"
if timed inspect "$CKPTCTL" inspect "$SAVED"; then
  head -12 "$LOGS/inspect.log" | sed 's/^/    /'
else
  fail_step "ckptctl inspect: $(tail -1 "$LOGS/inspect.log")"
fi
log "ckptctl export $SAVED -> $WORKDIR/export (safetensors)"
drop_cache export "$SAVED"
timed export "$CKPTCTL" export "$SAVED" "$WORKDIR/export" ||
  fail_step "ckptctl export: $(tail -1 "$LOGS/export.log")"

# ---- Object store (issue 43): the checkpoint to s3:// and back --------------------------------
# Copied up by ckptctl, verified there, loaded through the cluster straight from s3:// (each rank
# ranged-reading its bytes), resharded by the cluster's workers into s3:// (each rank writes its
# files locally, then uploads them into the coordinator's store write), and copied back.
if [[ "$S3_STATE" == "started" ]]; then
  S3_URL="s3://ckpt-demo/gpt-tp2dp2"
  log "object store: $SAVED -> $S3_URL, loads and a cluster reshard from and to s3://"
  drop_cache s3-save "$SAVED"
  if timed s3-save "$CKPTCTL" copy "$SAVED" "$S3_URL"; then
    timed s3-verify "$CKPTCTL" verify "$S3_URL" ||
      fail_step "ckptctl verify $S3_URL: $(tail -1 "$LOGS/s3-verify.log")"
    # The training job's own save straight to s3:// (each rank writes locally, then uploads).
    run_job s3-save-tp2dp2 4 "$LAYOUTS/tp2dp2.json" --save "s3://ckpt-demo/gpt-saved-tp2dp2" ||
      fail_step "save (TP=2 x DP=2) -> s3://ckpt-demo/gpt-saved-tp2dp2"
    timed s3-verify-saved "$CKPTCTL" verify "s3://ckpt-demo/gpt-saved-tp2dp2" ||
      fail_step "ckptctl verify of the save to s3://: $(tail -1 "$LOGS/s3-verify-saved.log")"
    run_job s3-load-tp4dp1 4 "$LAYOUTS/tp4dp1.json" --load "$S3_URL" ||
      fail_step "load into TP=4 x DP=1 from $S3_URL"
    if timed s3-reshard-cluster "$CKPTCTL" reshard "$S3_URL" "s3://ckpt-demo/gpt-cluster-tp4dp1" \
        --layout "$LAYOUTS/tp4dp1.json" --coordinator "$ADDRESS"; then
      timed s3-check-cluster "$GPT_TOOL" check "s3://ckpt-demo/gpt-cluster-tp4dp1" \
        --layout "$LAYOUTS/tp4dp1.json" ||
        fail_step "content check of the cluster reshard to s3://: $(tail -1 "$LOGS/s3-check-cluster.log")"
    else
      fail_step "ckptctl reshard --coordinator -> s3://: $(tail -1 "$LOGS/s3-reshard-cluster.log")"
    fi
    timed s3-load "$CKPTCTL" copy "$S3_URL" "$CK/gpt-from-s3" ||
      fail_step "ckptctl copy $S3_URL -> directory: $(tail -1 "$LOGS/s3-load.log")"
    timed s3-diff "$CKPTCTL" diff "$SAVED" "$CK/gpt-from-s3" ||
      fail_step "ckptctl diff (copied back from s3://): $(tail -1 "$LOGS/s3-diff.log")"
  else
    fail_step "ckptctl copy -> $S3_URL: $(tail -1 "$LOGS/s3-save.log")"
  fi
elif [[ "$S3_STATE" == "failed" ]]; then
  fail_step "object store: Swift did not start ($(tail -1 "$LOGS/s3-server.log"))"
else
  log "object store: skipped (Swift with s3api is not installed; tools/install_deps.sh installs it)"
fi

# ---- The table ---------------------------------------------------------------------------------
python3 - "$RESULTS" "$CKPT_BYTES" "$DD_BYTES" "$DD_NOTE" "$WORKDIR" <<'PY'
import glob, json, multiprocessing, os, sys, time

results, file_bytes, dd_bytes, dd_note, workdir = sys.argv[1:6]
file_bytes, dd_bytes = int(file_bytes), int(dd_bytes)

def seconds(name):
    try:
        return float(open(os.path.join(results, name + ".seconds")).read())
    except (OSError, ValueError):
        return None

def copy_part(nbytes, barrier, out):
    """One process's memcpy into memory it already touched (the second of two copies)."""
    src, dst = bytearray(b"\x5a" * nbytes), bytearray(nbytes)
    memoryview(dst)[:] = src  # faults the destination in
    barrier.wait()
    t = time.perf_counter()
    memoryview(dst)[:] = src
    out.put(time.perf_counter() - t)

def memcpy_touched(nbytes):
    """GB/s of a memcpy of nbytes into touched memory, the better of one process and one per
    CPU copying side by side (as the trainers' snapshots run): the limit of the snapshot
    Save() waits for."""
    return max(memcpy_procs(nbytes, 1) or 0, memcpy_procs(nbytes, os.cpu_count() or 1) or 0) or None

def memcpy_procs(nbytes, procs):
    part = max(1, nbytes // procs)
    mp = multiprocessing.get_context("fork")  # this script is read from stdin
    barrier, out = mp.Barrier(procs), mp.Queue()
    ps = [mp.Process(target=copy_part, args=(part, barrier, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    try:
        slowest = max(out.get(timeout=300) for _ in ps)
    except Exception as e:  # noqa: BLE001 - the table goes on without this limit
        print(f"demo: memcpy limit not measured: {e!r}", file=sys.stderr)
        slowest = 0
    for p in ps:
        p.join(timeout=10)
    return part * procs / slowest / 1e9 if slowest > 0 else None

def snapshot(name):
    """Slowest rank's time until Save returned (its part copied out of the trainer's memory)."""
    worst = None
    for f in glob.glob(os.path.join(results, name + ".rank*.jsonl")):
        for line in open(f):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("op") == "save" and "snapshot_seconds" in j:
                worst = max(worst or 0.0, j["snapshot_seconds"])
    return worst

def job(name, op, kind=None):
    """(bytes, seconds, ok) of a collective step: bytes summed over ranks, the slowest rank.
    With `kind`, the poll step that performed an operator-requested `kind` operation."""
    files = sorted(glob.glob(os.path.join(results, name + ".rank*.jsonl")))
    total, slowest, ok = 0, None, bool(files)
    for f in files:
        steps = []
        for line in open(f):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("event") == "step" and j.get("op") == op and (
                    kind is None or j.get("kind") == kind or not j.get("ok", True)):
                steps.append(j)
        if not steps:
            ok = False
            continue
        j = steps[-1]
        ok = ok and j.get("ok", False)
        total += j.get("stored_bytes" if "save" in (op, kind) else "bytes", 0)
        slowest = max(slowest or 0.0, j.get("seconds", 0.0))
    return total, slowest, ok

# Tensor bytes of the checkpoint: what the save's main replicas stored (each element once).
save_bytes, save_s, save_ok = job("save-tp2dp2", "save")
tensor_bytes = save_bytes if save_ok else file_bytes
dd_w, dd_r, dd_r8 = seconds("dd-write"), seconds("dd-read"), seconds("dd-read8")
bw_w = dd_bytes / dd_w / 1e9 if dd_w else None
bw_r1 = dd_bytes / dd_r / 1e9 if dd_r else None
bw_r8 = dd_bytes / dd_r8 / 1e9 if dd_r8 else None
bw_r = max(b for b in (bw_r1, bw_r8, 0) if b is not None) or None
# A reshard or export reads and writes every byte on one disk: at best 1/(1/read + 1/write).
bw_rw = 1 / (1 / bw_r + 1 / bw_w) if bw_r and bw_w else None
bw_mem = memcpy_touched(min(max(tensor_bytes, 64 << 20), 1 << 30))
limits = {"write": bw_w, "read": bw_r, "read+write": bw_rw, "memcpy": bw_mem}
rows = []

def resident(name):
    """Bytes of the step's input still in the page cache after eviction ("?" when unknown)."""
    try:
        v = open(os.path.join(results, name + ".resident")).read().strip()
    except OSError:
        return ""
    return "?" if not v.isdigit() else (f"{int(v) / 1e6:.0f} MB" if int(v) else "0")

def row(step, nbytes, secs, ok, limit, name="", disk_bytes=None):
    """limit: a key of `limits`. disk_bytes: what the step must move through the disk (default
    nbytes); a load delivers replicated elements to several ranks but reads the checkpoint's
    bytes."""
    gbps = nbytes / secs / 1e9 if ok and secs else None
    moved = nbytes if disk_bytes is None else disk_bytes
    moved_gbps = moved / secs / 1e9 if ok and secs else None
    lim = limits.get(limit)
    pct = 100 * moved_gbps / lim if moved_gbps and lim else None
    rows.append({"step": step, "bytes": nbytes, "seconds": secs if ok else None, "gbps": gbps,
                 "limit": limit, "limit_gbps": lim, "percent": pct, "cached": resident(name),
                 "ok": bool(ok)})

def ok_file(name):  # a step run by `timed` succeeded when its log says so
    return os.path.exists(os.path.join(results, name + ".ok"))

row("save    4 ranks TP2xDP2, cluster", save_bytes, save_s, save_ok, "write")
row("  of which until Save() returned", save_bytes, snapshot("save-tp2dp2"), save_ok, "memcpy")
for name, label in (("load-tp4dp1", "load    4 ranks TP4xDP1, cluster"),
                    ("load-uneven3", "load    3 ranks uneven, cluster"),
                    ("load-tp2dp2", "load    4 ranks TP2xDP2, cluster")):
    b, s, ok = job(name, "load")
    row(label, b, s, ok, "read", name, file_bytes)
# Operator requests: from `ckptctl save|load` being run to its end (commit / every rank loaded),
# the wait for the trainers' next Poll included. (A polled save lets the trainer go on at the
# snapshot, like Save; ckptctl waits for the commit.)
b, _, ok = job("ops-tp4dp1", "poll", "save")
row("save    ckptctl save -> committed", b, seconds("operator-save"),
    ok and ok_file("operator-save"), "write")
b, _, ok = job("ops-tp4dp1", "poll", "load")
row("load    ckptctl load -> loaded", b, seconds("operator-load"),
    ok and ok_file("operator-load"), "read", "operator-load", file_bytes)
for l, label in (("tp4dp1", "TP4xDP1"), ("uneven3", "uneven3")):
    row(f"reshard offline -> {label}", tensor_bytes, seconds("reshard-" + l),
        ok_file("reshard-" + l), "read+write", "reshard-" + l)
row("reshard cluster -> TP4xDP1", tensor_bytes, seconds("reshard-cluster"),
    ok_file("reshard-cluster") and ok_file("check-cluster"), "read+write", "reshard-cluster")
row("export  -> safetensors", tensor_bytes, seconds("export"), ok_file("export"), "read+write",
    "export")
row("verify  checksums, every byte", tensor_bytes, seconds("verify"), ok_file("verify"), "read",
    "verify", file_bytes)
row("check   every element (offline)", tensor_bytes, seconds("check-saved"),
    ok_file("check-saved"), "read", "check-saved", file_bytes)
if os.path.exists(os.path.join(results, "s3-server.json")):  # Swift on this disk, loopback
    row("s3      ckptctl copy -> s3://", file_bytes, seconds("s3-save"), ok_file("s3-save"),
        "read+write", "s3-save")
    row("s3      verify s3://, every byte", file_bytes, seconds("s3-verify"),
        ok_file("s3-verify"), "read")
    b, s, ok = job("s3-save-tp2dp2", "save")
    row("s3      save 4 ranks TP2xDP2 -> s3://", b, s, ok and ok_file("s3-verify-saved"), "write")
    b, s, ok = job("s3-load-tp4dp1", "load")
    row("s3      load 4 ranks TP4xDP1 <- s3://", b, s, ok, "read")
    row("s3      reshard cluster s3:// -> s3://", tensor_bytes, seconds("s3-reshard-cluster"),
        ok_file("s3-reshard-cluster") and ok_file("s3-check-cluster"), "read+write")
    row("s3      ckptctl copy s3:// -> dir", file_bytes, seconds("s3-load"),
        ok_file("s3-load") and ok_file("s3-diff"), "read+write")

with open(os.path.join(results, "table.json"), "w") as f:
    json.dump({"tensor_bytes": tensor_bytes, "file_bytes": file_bytes, "dd_bytes": dd_bytes,
               "dd_note": dd_note, "read_1": bw_r1, "read_8": bw_r8, "limits": limits,
               "rows": rows}, f, indent=1)

print()
fmt = lambda v: f"{v:.2f} GB/s" if v else "not measured"
print(f"checkpoint: {tensor_bytes:,} tensor bytes ({file_bytes:,} in files); limits measured now: "
      f"dd {dd_note}, {dd_bytes:,} bytes: write {fmt(bw_w)}, read {fmt(bw_r1)} (1 reader) / "
      f"{fmt(bw_r8)} (8 readers); read+write floor 1/(1/read + 1/write) {fmt(bw_rw)}; memcpy "
      f"into touched memory (best of 1 and {os.cpu_count()} processes): {fmt(bw_mem)}")
print("% of limit: the bytes the step moves (a load: the checkpoint's files, though it delivers"
      " replicated elements to\nseveral ranks) per second, against its limit: write (dd) for a"
      " save, memcpy for the snapshot Save() waits\nfor, read (dd, the better of 1 and 8 readers)"
      " for a load, verify or check, the read+write floor for a reshard\nor export. cached: the"
      " step's input still in the page cache after eviction (checked with fincore; 0 = none\nof"
      " it came from this machine's page cache). Above 100% with cached 0, the storage served"
      " more than dd\nmeasured (e.g. a virtual disk's host-side cache).")
print(f"{'step':34} {'bytes':>14} {'seconds':>9} {'GB/s':>7}  {'limit':<10} {'GB/s':>6} "
      f"{'%':>5} {'cached':>7} result")
for r in rows:
    secs_s = f"{r['seconds']:9.3f}" if r["seconds"] is not None else f"{'-':>9}"
    gbps_s = f"{r['gbps']:7.2f}" if r["gbps"] else f"{'-':>7}"
    lim_s = f"{r['limit_gbps']:6.2f}" if r["limit_gbps"] else f"{'-':>6}"
    pct_s = f"{r['percent']:4.0f}%" if r["percent"] is not None else f"{'-':>5}"
    print(f"{r['step']:34} {r['bytes']:>14,} {secs_s} {gbps_s}  {r['limit']:<10} {lim_s} "
          f"{pct_s} {r['cached']:>7} {'ok' if r['ok'] else 'FAILED'}")
PY

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo
  echo "demo: ${#FAILED[@]} step(s) failed:"
  for f in "${FAILED[@]}"; do echo "  - $f"; done
  exit 1
fi
echo
echo "demo: every step succeeded"
