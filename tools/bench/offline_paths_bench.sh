#!/usr/bin/env bash
# The offline paths (ckptctl import from safetensors, export to safetensors, offline reshard)
# against the disk's read+write floor 1/(1/read + 1/write), measured in the same run: read is a
# cold O_DIRECT dd read of the source, write a dd of as many bytes with O_DIRECT and fsync.
# Each path runs with the page cache dropped first (cold) and again right after (warm: the
# source is then in the page cache). Several ckptctl binaries can be compared in one run (e.g.
# the one built before a change and after), each measured with the same floor.
#
#   bazel build -c opt //tools:ckptctl && cp bazel-bin/tools/ckptctl /tmp/ckptctl_new
#   tools/bench/offline_paths_bench.sh [--size_mb 1200] [--repeat 2] new=/tmp/ckptctl_new \
#       [old=/tmp/ckptctl_old]
# Needs root (or passwordless sudo) to drop the page cache, and the project's .venv for the
# safetensors source. Everything is written under a fresh mktemp -d directory, removed at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
size_mb=1200
repeat=1
bins=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size_mb) size_mb="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *=*) bins+=("$1"); shift ;;
    *) echo "offline_paths_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ ${#bins[@]} -gt 0 ]] || { echo "offline_paths_bench: name at least one label=ckptctl" >&2; exit 2; }
dir=$(mktemp -d /tmp/ckpt_offline_bench.XXXXXX)
trap 'rm -rf -- "$dir"' EXIT

drop_caches() {
  sync
  if [[ $(id -u) -eq 0 ]]; then echo 3 > /proc/sys/vm/drop_caches
  else sudo -n sh -c 'echo 3 > /proc/sys/vm/drop_caches'; fi
}
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }

# The source: fp32 and bf16 tensors of 4096-wide rows, about size_mb MB, one safetensors file.
.venv/bin/python - "$dir/src.safetensors" "$size_mb" <<'PY'
import sys, torch
from safetensors.torch import save_file
path, size_mb = sys.argv[1], int(sys.argv[2])
state, left, i = {}, size_mb << 20, 0
while left > 0:
    rows = min(2048, max(1, left // (4096 * 4)))
    x = torch.arange(rows * 4096, dtype=torch.int64).mul_(0x9E3779B1 + i).remainder_(65521)
    t = x.to(torch.float32 if i % 3 else torch.bfloat16).reshape(rows, 4096)
    state[f"layers.{i:03d}.weight"] = t
    left -= t.numel() * t.element_size()
    i += 1
save_file(state, path)
PY
bytes=$(stat -c %s "$dir/src.safetensors")
cat > "$dir/layout.json" <<'JSON'
{"mesh": {"r": 3}, "rules": [{"match": "*", "placements": ["Shard(0)"]}]}
JSON
first_bin=${bins[0]#*=}
"$first_bin" import "$dir/src.safetensors" "$dir/ckpt" > /dev/null

floor() {  # prints "read_s write_s floor_s" for $bytes bytes
  drop_caches
  local t0 t1 t2
  t0=$(now)
  dd if="$dir/src.safetensors" of=/dev/null bs=16M iflag=direct status=none
  t1=$(now)
  dd if=/dev/zero of="$dir/dd.bin" bs=16M count=$((bytes / (16 << 20))) oflag=direct \
    conv=fsync status=none
  t2=$(now)
  rm -f -- "$dir/dd.bin"
  python3 -c "r=$t1-$t0; w=($t2-$t1)*$bytes/(($bytes//(16<<20))*(16<<20)); print(f'{r:.3f} {w:.3f} {r+w:.3f}')"
}

run() {  # label bin path mode -> seconds; the output is removed first (never timed)
  local bin=$2 path=$3 mode=$4 t0 t1
  rm -rf -- "$dir/imported" "$dir/exported.safetensors" "$dir/resharded"
  [[ $mode == cold ]] && drop_caches
  case "$path" in
    import) t0=$(now); "$bin" import "$dir/src.safetensors" "$dir/imported" > /dev/null; t1=$(now) ;;
    export) t0=$(now); "$bin" export "$dir/ckpt" "$dir/exported.safetensors" > /dev/null
      t1=$(now) ;;
    reshard) t0=$(now); "$bin" reshard "$dir/ckpt" "$dir/resharded" --layout "$dir/layout.json" \
        > /dev/null; t1=$(now) ;;
  esac
  secs "$t0" "$t1"
}

echo "offline paths: $((bytes / 1000000)) MB, $(nproc) CPUs, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-8s | %-7s | %-5s | %7s | %7s | %7s | %7s | %6s |\n' binary path cache s \
  "read s" "write s" "floor s" "% floor"
for ((r = 0; r < repeat; r++)); do
  for path in import export reshard; do
    for b in "${bins[@]}"; do
      label=${b%%=*}; bin=${b#*=}
      read -r fr fw ff < <(floor)
      for mode in cold warm; do
        t=$(run "$label" "$bin" "$path" "$mode")
        pct=$(python3 -c "print(f'{100 * $ff / $t:.0f}')")
        printf '| %-8s | %-7s | %-5s | %7s | %7s | %7s | %7s | %5s%% |\n' "$label" "$path" \
          "$mode" "$t" "$fr" "$fw" "$ff" "$pct"
      done
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
