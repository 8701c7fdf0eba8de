"""Live transfer from Python (ckpt.Client.publish / receive) against real daemons started by
ckpt.LocalCluster: a 2-rank source job (rows) publishes versions, a 3-rank destination job
(column blocks) receives them; a receive of a version never published fails naming it and
leaves the destination's tensors as they were. Ranks run as threads of this process."""


import pytest
import torch

import ckpt
import rank_threads  # beside this file

SHAPE = (4, 6)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 2)


def ranks(world, body, job):
    """Rank r on worker r % 2."""
    return rank_threads.ranks(world, body, job, workers=2)


def version(v):
    return torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.int32).view(SHAPE) + 1000 * v


def test_publish_and_receive_successive_versions_into_another_layout(cluster):
    def publish(v):
        def body(client):
            r = client.rank
            state = client.state_dict()
            rows = version(v)[2 * r:2 * r + 2].clone()
            state.add("w", rows, ckpt.DTensor(SHAPE, (2,), [ckpt.Shard(0)], (r,)))
            handle = client.publish("py-policy", state, version=v)
            rows.zero_()  # training goes on: the published version keeps its values
            handle.wait(60)
            return handle.version
        assert ranks(2, body, "py-src") == [v, v]

    def receive(versions):
        def body(client):
            r = client.rank
            layout = ckpt.DTensor(SHAPE, (3,), [ckpt.Shard(1)], (r,))
            cols = torch.zeros(SHAPE[0], 2, dtype=torch.int32)
            state = client.state_dict()
            state.add("w", cols, layout)
            seen = []
            for want in versions:
                try:
                    got = client.receive("py-policy", state, version=want)
                    # Receive reports what arrived; 0 asked for the newest, version 2.
                    assert got == ckpt.Received("py-policy", want or 2), got
                    seen.append(cols.clone())
                except ckpt.NotFound as e:
                    assert "xfer://py-policy@%d" % want in str(e), e
                    seen.append(("refused", cols.clone()))
            return seen
        return ranks(3, body, "py-dst")

    publish(1)
    publish(2)
    got = receive([1, 2, 7, 0])
    for r, seen in enumerate(got):
        assert torch.equal(seen[0], version(1)[:, 2 * r:2 * r + 2]), r
        assert torch.equal(seen[1], version(2)[:, 2 * r:2 * r + 2]), r
        refused, after = seen[2]
        assert refused == "refused" and torch.equal(after, version(2)[:, 2 * r:2 * r + 2]), r
        assert torch.equal(seen[3], version(2)[:, 2 * r:2 * r + 2]), r


def test_a_receive_by_all_to_all_is_bit_exact_and_an_unknown_algorithm_is_refused(cluster):
    def publish(client):
        r = client.rank
        state = client.state_dict()
        rows = version(5)[2 * r:2 * r + 2].clone()
        state.add("w", rows, ckpt.DTensor(SHAPE, (2,), [ckpt.Shard(0)], (r,)))
        handle = client.publish("py-a2a", state, version=5)
        handle.wait(60)
        return handle.version
    assert ranks(2, publish, "py-a2a-src") == [5, 5]

    def receive(client):
        r = client.rank
        cols = torch.full((SHAPE[0], 2), -1, dtype=torch.int32)
        state = client.state_dict()
        state.add("w", cols, ckpt.DTensor(SHAPE, (3,), [ckpt.Shard(1)], (r,)))
        with pytest.raises(ckpt.InvalidArgument, match="no_such_algorithm"):
            client.receive("py-a2a", state, algorithm="no_such_algorithm")
        untouched = cols.clone()
        got = client.receive("py-a2a", state, algorithm="overlap_all_to_all")
        return untouched, got, cols.clone()
    for r, (untouched, got, cols) in enumerate(ranks(3, receive, "py-a2a-dst")):
        assert torch.equal(untouched, torch.full((SHAPE[0], 2), -1, dtype=torch.int32)), r
        assert got == ckpt.Received("py-a2a", 5), got
        assert torch.equal(cols, version(5)[:, 2 * r:2 * r + 2]), r


def test_a_version_out_of_range_is_refused_naming_the_name(cluster):
    def body(client):
        state = client.state_dict()
        state.add("w", torch.zeros(2, 2, dtype=torch.int32), ckpt.Replicated(1))
        refused = []
        for v in (-7, 2**63, -(2**63) - 1):
            with pytest.raises(ckpt.InvalidArgument, match="py-range") as e:
                client.publish("py-range", state, version=v)
            refused.append(str(e.value))
        with pytest.raises(ckpt.InvalidArgument, match="py-range"):
            client.receive("py-range", state, version=2**64)
        return refused
    refused = ranks(1, body, "py-range-src")[0]
    assert "-7" in refused[0] and str(2**63) in refused[1], refused
