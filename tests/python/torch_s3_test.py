"""ckpt.torch.save/load with checkpoint_id="s3://bucket/prefix" (issue 43) on one rank against
real daemons and a real one-node Swift with s3api (Debian's python3-swift, started by
storage/s3/testing/swift_server.py): the daemons find the server through the standard AWS
environment variables, as a user's would. The state comes back bit for bit, a second save to
the same URL is refused naming it, and an overwrite replaces it."""

import json
import os
import subprocess
import uuid

import pytest
import torch

import ckpt
import ckpt.torch
import rank_threads  # beside this file

BUCKET = "torch-s3"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    script = os.environ.get("SWIFT_SERVER")
    if not script:
        pytest.skip("SWIFT_SERVER (storage/s3/testing/swift_server.py) not given")
    d = str(tmp_path_factory.mktemp("swift"))
    out = subprocess.run(["/usr/bin/python3", script, "start", "--dir", d, "--bucket", BUCKET,
                          "--owner-pid", str(os.getpid())],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    os.environ.update(AWS_ACCESS_KEY_ID=info["access_key_id"],
                      AWS_SECRET_ACCESS_KEY=info["secret_access_key"],
                      AWS_REGION=info["region"], AWS_ENDPOINT_URL=info["endpoint"])
    os.environ.pop("AWS_PROFILE", None)
    yield info
    subprocess.run(["/usr/bin/python3", script, "stop", "--dir", d], timeout=60)


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    gen = rank_threads.local_cluster(
        tmp_path_factory, 1, torch_job="torch-s3",
        coordinator_args=[f"--checkpoint_root=s3://{BUCKET}/runs"])
    yield from gen


def state(scale=1.0):
    g = torch.Generator().manual_seed(43)
    return {
        "model": {"w": torch.randn(700, 300, generator=g) * scale,
                  "b": (torch.randn(300, generator=g) * scale).to(torch.bfloat16)},
        "step": torch.arange(10, dtype=torch.int64),
    }


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    return torch.zeros_like(sd)


def assert_equal(got, want):
    for k in want:
        if isinstance(want[k], dict):
            assert_equal(got[k], want[k])
        else:
            assert torch.equal(got[k], want[k]), k


def test_a_save_to_s3_loads_back_bit_exact(cluster):
    url = f"s3://{BUCKET}/runs/{uuid.uuid4().hex[:8]}/step1"
    want = state()
    ckpt.torch.save(want, checkpoint_id=url)
    got = zeros_like(want)
    ckpt.torch.load(got, checkpoint_id=url)
    assert_equal(got, want)


def test_a_second_save_is_refused_naming_the_url_and_overwrite_replaces_it(cluster):
    url = f"s3://{BUCKET}/runs/{uuid.uuid4().hex[:8]}/step1"
    ckpt.torch.save(state(), checkpoint_id=url)
    with pytest.raises(ckpt.AlreadyExists, match=url):
        ckpt.torch.save(state(2.0), checkpoint_id=url)
    ckpt.torch.save(state(3.0), checkpoint_id=url, overwrite=True)
    got = zeros_like(state())
    ckpt.torch.load(got, checkpoint_id=url)
    assert_equal(got, state(3.0))
