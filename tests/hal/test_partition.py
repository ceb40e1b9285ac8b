"""Graph partitioning (quanta/targets/partition.py) on random step sequences: the
partitions cover the steps in order, alternate devices, and every value that crosses a
device partition's boundary is an upload or a download of it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from quanta.targets.partition import PartitionStep, partition_steps, transfer_count


def random_steps(seed: int, n: int = 23):
    """Steps reading earlier values (ids 1.. are the graph inputs and constants first)."""
    rng = np.random.default_rng(seed)
    inputs, consts = [1, 2], [3, 4, 5]
    available = inputs + consts
    steps = []
    next_id = 6
    for k in range(n):
        reads = [
            int(v)
            for v in rng.choice(available, size=min(len(available), int(rng.integers(1, 4))), replace=False)
        ]
        outs = [next_id]
        next_id += 1
        available.append(outs[0])
        device = "dev" if rng.random() < 0.6 else ""
        steps.append(PartitionStep(k, device, tuple(reads), tuple(outs), "" if device else f"why {k}"))
    graph_outputs = [next_id - 1, int(rng.choice(available[5:]))]
    return steps, consts, graph_outputs


@pytest.mark.parametrize("seed", range(12))
def test_partitions_cover_steps_and_every_crossing_is_a_transfer(seed):
    steps, consts, outs = random_steps(seed)
    parts = partition_steps(steps, consts, outs)
    assert [k for p in parts for k in p.steps] == [s.index for s in steps]
    assert all(a.device != b.device for a, b in itertools.pairwise(parts))
    owner = {o: p.index for p in parts for k in p.steps for o in steps[k].outputs}
    for p in parts:
        reads = {v for k in p.steps for v in steps[k].inputs}
        produced = {o for k in p.steps for o in steps[k].outputs}
        assert set(p.uploads) == {v for v in reads - produced if v not in consts}
        assert set(p.constants) == reads & set(consts)
        read_later = {v for q in parts[p.index + 1 :] for k in q.steps for v in steps[k].inputs}
        assert set(p.downloads) == produced & (read_later | set(outs))
        for v in p.uploads:  # an upload comes from an earlier partition or the inputs
            assert v in (1, 2) or owner[v] < p.index
        if p.on_host:
            assert set(p.reasons) == set(p.steps)
    up, down = transfer_count(parts)
    assert up == sum(len(p.uploads) for p in parts if not p.on_host)
    assert down == sum(len(p.downloads) for p in parts if not p.on_host)


def test_one_device_no_transfers():
    steps = [PartitionStep(k, "", (k + 1,), (k + 2,)) for k in range(4)]
    parts = partition_steps(steps, [], [5])
    assert len(parts) == 1 and parts[0].on_host and transfer_count(parts) == (0, 0)
