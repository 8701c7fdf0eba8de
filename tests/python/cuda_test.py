"""CUDA tensors through the Python package (requires-gpu: every case skips without a GPU).

The worker shares each CUDA tensor through its allocation's CUDA IPC handle (saves stage it off
the device through the worker's pinned pool; loads land in it); ckpt.torch passes DTensor and
plain CUDA tensors the same way; live transfer publishes CUDA tensors from a host copy and
receives into CUDA tensors through a host shadow (copied to the device once the version is
whole); memory saves (mem://) stage CUDA tensors through a host shadow the same way and load
back into CUDA tensors. Never run on a GPU so far: the machines this was written on have none."""

import os
import threading

import pytest
import torch

import ckpt
import ckpt.torch
import rank_threads  # beside this file

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="requires a CUDA GPU")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 2, check_exits=False)


def test_cuda_tensors_save_and_load_in_place(cluster):
    path = os.path.join(cluster.root, "cuda-round-trip")
    saved = torch.arange(4096, dtype=torch.float32, device="cuda")
    with ckpt.Client(job="cuda", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict()
        state.add("w", saved)
        client.save(path, state).wait(120)
        target = torch.full_like(saved, -1.0)
        loaded = client.state_dict()
        loaded.add("w", target)
        client.load(path, loaded)
    assert torch.equal(target, saved)


def test_cuda_tensors_saved_to_memory_load_back_into_cuda(cluster):
    saved = torch.arange(4096, dtype=torch.float32, device="cuda")
    with ckpt.Client(job="cuda-mem", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict()
        state.add("w", saved)
        handle = client.save("mem://cuda-mem", state, memory_replicas=0)
        expected = saved.clone()
        saved.fill_(-2.0)  # training goes on: the memory checkpoint keeps the values at save
        handle.wait(120)
        target = torch.full_like(expected, -1.0)
        loaded = client.state_dict()
        loaded.add("w", target)
        client.load("mem://cuda-mem", loaded)
    assert torch.equal(target, expected)


def test_a_non_contiguous_cuda_tensor_is_refused_naming_it(cluster):
    with ckpt.Client(job="cuda-strided", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict()
        strided = torch.zeros(8, 8, device="cuda").t()
        with pytest.raises(ckpt.InvalidArgument, match="tensor t .*not contiguous"):
            state.add("t", strided)


def test_ckpt_torch_round_trips_a_cuda_state_dict(cluster, monkeypatch):
    for name, value in dict(CKPT_JOB="cuda-torch", RANK="0", WORLD_SIZE="1",
                            LOCAL_RANK="0").items():
        monkeypatch.setenv(name, value)
    path = os.path.join(cluster.root, "cuda-torch")
    model = {"w": torch.randn(64, 64, device="cuda"), "step": 3}
    ckpt.torch.save(model, checkpoint_id=path)
    restored = {"w": torch.zeros(64, 64, device="cuda"), "step": 0}
    ckpt.torch.load(restored, checkpoint_id=path)
    ckpt.torch.shutdown()
    assert torch.equal(restored["w"], model["w"]) and restored["step"] == 3


def test_publish_from_cuda_and_receive_into_cuda(cluster):
    source = torch.arange(1024, dtype=torch.int32, device="cuda")
    received = torch.zeros(1024, dtype=torch.int32, device="cuda")
    published = threading.Event()
    errors = []

    def publisher():
        try:
            with ckpt.Client(job="cuda-src", rank=0, world_size=1, local_rank=0) as client:
                state = client.state_dict()
                state.add("w", source)
                client.publish("cuda-policy", state, version=1).wait(120)
                published.set()
        except BaseException as e:  # handed to the test thread
            errors.append(e)
            published.set()

    thread = threading.Thread(target=publisher)
    thread.start()
    published.wait(180)
    thread.join()
    assert not errors, errors
    with ckpt.Client(job="cuda-dst", rank=0, world_size=1, local_rank=1) as client:
        state = client.state_dict()
        state.add("w", received)
        client.receive("cuda-policy", state, version=1)
    assert torch.equal(received, source)
