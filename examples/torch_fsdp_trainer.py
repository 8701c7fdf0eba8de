"""A small transformer language model trained with FSDP2 (fully_shard) on the CPU over gloo,
checkpointed with ckpt.torch, resumable on another world size.

    # 4 ranks train 20 steps and save; then 2 ranks resume from that checkpoint.
    export PYTHONPATH=$PWD/python
    .venv/bin/python -m ckpt.up --workers 4 --root /tmp/ckpt-demo -- \\
      .venv/bin/torchrun --nproc-per-node 4 examples/torch_fsdp_trainer.py \\
        --steps 20 --save-every 10 --dir /tmp/ckpt-demo/run
    .venv/bin/python -m ckpt.up --workers 2 --root /tmp/ckpt-demo -- \\
      .venv/bin/torchrun --nproc-per-node 2 examples/torch_fsdp_trainer.py \\
        --resume /tmp/ckpt-demo/run/step20 --steps 30 --dir /tmp/ckpt-demo/run

The data is synthetic but learnable (each sequence counts up modulo the vocabulary from a
random start), so the loss falls visibly within tens of steps. Every rank prints nothing but
rank 0's log lines. Saves are asynchronous (--sync for blocking ones): training goes on while
the workers write and fsync.
"""

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt.torch


class TinyLM(torch.nn.Module):
    """Token + position embeddings, pre-norm transformer blocks, tied-free output head."""

    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                             norm_first=True) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(self.norm(x))


def batch(step, rank, args):
    """Sequences counting up mod vocab from random starts; each rank its own data shard."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    return (start + torch.arange(args.seq + 1)) % args.vocab


def build(args, world):
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * min(s, 200) / 200)))
    return model, optim, sched


def checkpoint_state(model, optim, sched, step):
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict(), "step": step}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="train until this step")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--dir", default="/tmp/ckpt-demo/run", help="checkpoints go to DIR/step<N>")
    p.add_argument("--resume", help="checkpoint to resume from (any world size)")
    p.add_argument("--sync", action="store_true", help="blocking saves instead of async_save")
    p.add_argument("--vocab", type=int, default=97)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = print if rank == 0 else (lambda *a, **k: None)
    model, optim, sched = build(args, world)
    step = 0
    if args.resume:
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        _init_optim_state(optim)  # optimizer states exist, so load fills them in place
        state = checkpoint_state(model, optim, sched, 0)
        t = time.perf_counter()
        ckpt.torch.load(state, checkpoint_id=args.resume)
        set_state_dict(model, optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
        log(f"resumed {args.resume} at step {step} on {world} ranks "
            f"({time.perf_counter() - t:.2f}s)")
    pending = None
    while step < args.steps:
        tokens = batch(step, rank, args)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
        sched.step()
        step += 1
        log(f"step {step:4d} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}")
        if step % args.save_every == 0 or step == args.steps:
            if pending is not None:
                pending.result()  # one save in flight at a time
            path = os.path.join(args.dir, f"step{step}")
            state = checkpoint_state(model, optim, sched, step)
            t = time.perf_counter()
            if args.sync:
                ckpt.torch.save(state, checkpoint_id=path)
            else:
                pending = ckpt.torch.async_save(state, checkpoint_id=path)
            log(f"saved {path} ({'blocking' if args.sync else 'snapshot'} "
                f"{time.perf_counter() - t:.2f}s)")
    if pending is not None:
        pending.result()
    log(f"done at step {step}; last loss {loss.item():.4f}")
    ckpt.torch.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
