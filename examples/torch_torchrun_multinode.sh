#!/usr/bin/env bash
# ckpt with torchrun on several hosts: one coordinator (on the head node), and on every node a
# ckpt worker per GPU started next to torchrun (python -m ckpt.up --join ... -- torchrun ...).
#
#   head$  examples/torch_torchrun_multinode.sh coordinator
#   nodeN$ HEAD=head NNODES=4 NODE_RANK=N examples/torch_torchrun_multinode.sh node
#
# Checkpoints must live on a filesystem every node sees (CKPT_ROOT). This script uses
# --insecure for brevity; use certificates on a real network (docs/services.md, Security:
# ckptctl certs init/issue, then --coordinator-arg=--tls_ca=... and --worker-arg=--tls_ca=...).
# Written for the multi-host case, which this project's CI (one host) does not run.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
export PYTHONPATH=$REPO/python${PYTHONPATH:+:$PYTHONPATH}
CKPT_ROOT=${CKPT_ROOT:-/shared/ckpt}
PORT=${PORT:-7400}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l || echo 1)}
GPUS=${GPUS:-1}

case "${1:-}" in
  coordinator)
    exec "$PY" -m ckpt.up --coordinator-only --listen "0.0.0.0:$PORT" --root "$CKPT_ROOT" \
      --coordinator-arg=--insecure
    ;;
  node)
    : "${HEAD:?set HEAD to the coordinator host}" "${NNODES:?}" "${NODE_RANK:?}"
    # The data plane (Gloo between workers) binds to this address: an interface the other
    # nodes reach (put it on an isolated network; it is not encrypted).
    IP=${IP:-$(hostname -I | awk '{print $1}')}
    exec "$PY" -m ckpt.up --join "$HEAD:$PORT" --workers "$GPUS" \
      --worker-arg=--insecure --worker-arg="--data_plane_address=$IP" -- \
      "$REPO/.venv/bin/torchrun" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
      --nproc-per-node "$GPUS" --rdzv-backend c10d --rdzv-endpoint "$HEAD:29400" \
      --rdzv-id "${JOB:-ckpt-example}" \
      "$REPO/examples/torch_fsdp_trainer.py" --dir "$CKPT_ROOT/run" "${@:2}"
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
