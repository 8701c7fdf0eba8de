"""Object-store URLs (checkpoint_id="s3://bucket/prefix", issue 43) in the Python package: they
go to the coordinator as given, never made absolute against the working directory
("/cwd/s3:/bucket/...") nor looked up or created on the local filesystem. One rank, real
daemons whose only checkpoint root is a local directory: the coordinator refuses the URL, and
its refusal names the URL exactly as the caller wrote it (saving to S3 itself is
torch_s3_test's)."""

import os

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

import ckpt
import ckpt.torch
from ckpt import _dcp_read
import rank_threads  # beside this file

URL = "s3://bucket/ckpts/step1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 1, torch_job="torch-url")


@pytest.fixture
def in_empty_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_torch_save_sends_an_s3_checkpoint_id_as_given_and_creates_nothing_here(cluster,
                                                                                in_empty_dir):
    with pytest.raises(ckpt.PermissionDenied) as e:
        ckpt.torch.save({"w": torch.ones(4)}, checkpoint_id=URL)
    assert f"'{URL}'" in str(e.value) and "outside" in str(e.value)
    assert os.listdir(in_empty_dir) == []  # no "s3:" directory made for it


def test_client_save_and_load_send_an_s3_url_as_given(cluster, in_empty_dir):
    client = ckpt.torch.get_client()
    state = client.state_dict().add("w", torch.ones(4))
    with pytest.raises(ckpt.PermissionDenied) as e:
        client.save(URL, state).wait()
    assert f"'{URL}'" in str(e.value)
    with pytest.raises(ckpt.PermissionDenied) as e:
        client.load(URL, state)
    assert f"'{URL}'" in str(e.value)
    assert os.listdir(in_empty_dir) == []


def test_a_dcp_read_check_never_takes_an_s3_url_for_a_local_directory(in_empty_dir):
    os.makedirs(os.path.join(in_empty_dir, "s3:", "bucket", "ckpts", "step1"))
    open(os.path.join(in_empty_dir, "s3:/bucket/ckpts/step1/.metadata"), "wb").close()
    assert _dcp_read.checkpoint_path(URL, None) == URL
    assert not _dcp_read.is_dcp_checkpoint(URL)


def test_a_filesystem_writer_or_reader_that_made_a_url_a_path_is_refused_naming_the_url(
        cluster, in_empty_dir):
    with pytest.raises(ckpt.InvalidArgument) as e:
        ckpt.torch.save({"w": torch.ones(4)}, storage_writer=FileSystemWriter(URL))
    assert f"checkpoint_id='{URL}'" in str(e.value)
    with pytest.raises(ckpt.InvalidArgument) as e:
        ckpt.torch.load({"w": torch.ones(4)}, storage_reader=FileSystemReader(URL))
    assert f"checkpoint_id='{URL}'" in str(e.value)
    assert os.listdir(in_empty_dir) == []


def test_a_local_cluster_takes_an_s3_checkpoint_root_as_given():
    # The coordinator starts only when the root reaches it unmangled and it accepts URL roots.
    with ckpt.LocalCluster(num_workers=0, root="s3://bucket/ckpts/", export_env=False) as c:
        assert c.root == "s3://bucket/ckpts/"
        assert c.address
