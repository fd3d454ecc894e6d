"""Fixtures shared by the environment tests (tests/envs mirrors envs/)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from placement_rl.io import write_json
from placement_rl.topology import load_preset


@pytest.fixture(scope="session")
def shrunk_topology(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``shrunk_topology(name, memory_bytes)``: the ``trinity`` preset (1 machine x 4 P100, 11 GiB)
    with each device's memory replaced by ``memory_bytes`` (one value per device), written as a
    topology JSON file; returns its path (a generator's ``topology`` accepts it)."""
    folder = tmp_path_factory.mktemp("topologies")

    def make(name: str, memory_bytes: Sequence[int]) -> str:
        document = load_preset("trinity").to_dict()
        assert len(memory_bytes) == len(document["devices"])
        document["name"] = name
        for device, memory in zip(document["devices"], memory_bytes, strict=True):
            device["memory_bytes"] = int(memory)
        path = folder / f"{name}.json"
        write_json(path, document)
        return str(path)

    return make
