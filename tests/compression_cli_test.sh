#!/usr/bin/env bash
# ckptctl on a compressed checkpoint (issue 40 item 6): `reshard --compression zstd` writes one;
# inspect shows codec and ratio per tensor and says plain safetensors readers cannot read it as
# tensors; verify passes; diff against the uncompressed source finds no difference; export
# writes plain safetensors whose bytes equal the source's; a flipped stored byte fails verify.
set -euo pipefail
CKPTCTL=${CKPTCTL:-$(dirname "$0")/../tools/ckptctl}
[[ -x "$CKPTCTL" ]] || CKPTCTL=$TEST_SRCDIR/ckpt/tools/ckptctl
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/compression-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A safetensors file of weight-like bf16 and f32 tensors (NaN payload, -0.0, subnormal), an i64.
python3 - "$work/src.safetensors" <<'PY'
import json, random, struct, sys
random.seed(1)
def bf16(x):
    return struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0])[2:]
w = b"".join(bf16(random.gauss(0, 0.02)) for _ in range(256 * 300))
f = b"".join(struct.pack("<f", random.gauss(0, 1)) for _ in range(997))
f += struct.pack("<III", 0x7FC00123, 0x80000000, 0x00000001)
i = b"".join(struct.pack("<q", k % 5) for k in range(100))
entries, data = {}, b""
for name, dtype, shape, raw in (("w", "BF16", [256, 300], w), ("f", "F32", [1000], f),
                                ("step", "I64", [100], i)):
    entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
header = json.dumps(entries).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + data)
PY
cat > "$work/layout.json" <<'JSON'
{"mesh": {"tp": 2}, "rules": [{"match": "w", "placements": ["Shard(1)"]},
                              {"match": "*", "placements": ["Replicate()"]}]}
JSON
"$CKPTCTL" import "$work/src.safetensors" "$work/plain" >/dev/null
"$CKPTCTL" reshard "$work/plain" "$work/packed" --layout "$work/layout.json" --compression zstd \
  >/dev/null

out=$("$CKPTCTL" inspect "$work/packed")
grep -q "not readable as tensors by a plain safetensors reader" <<<"$out" ||
  { echo "inspect does not say the checkpoint is compressed:"; echo "$out"; exit 1; }
grep -q "^w  BF16 (256, 300) .*bytegroup-zstd: .* stored (" <<<"$out" ||
  { echo "inspect shows no codec and ratio for w:"; echo "$out"; exit 1; }
"$CKPTCTL" inspect --json "$work/packed" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["compressed_pieces"] == j["piece_count"] and not j["plain_safetensors_readable"], j
w = [t for t in j["tensors"] if t["key"] == "w"][0]
assert w["codec"] == "bytegroup-zstd" and w["ratio"] < 0.8, w'

"$CKPTCTL" verify "$work/packed" >/dev/null
"$CKPTCTL" diff "$work/plain" "$work/packed" >/dev/null
"$CKPTCTL" export "$work/packed" "$work/out.safetensors" >/dev/null
python3 - "$work/src.safetensors" "$work/out.safetensors" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a == b, "export of the compressed checkpoint differs from the source"
PY

# A flipped byte inside a stored frame: verify fails naming the file.
python3 - "$work/packed" <<'PY'
import glob, sys
f = sorted(glob.glob(sys.argv[1] + "/data/*.safetensors"))[0]
b = bytearray(open(f, "rb").read())
b[-40] ^= 0x08
open(f, "wb").write(b)
PY
if err=$("$CKPTCTL" verify "$work/packed" 2>&1); then
  echo "verify passed a corrupted compressed checkpoint"; exit 1
fi
grep -q "safetensors" <<<"$err" || { echo "verify's error names no file: $err"; exit 1; }
echo "compression_cli_test: OK"
