"""The project's local Ray listens on the loopback interface only."""

from __future__ import annotations

import subprocess
from typing import Any


def test_local_ray_binds_to_loopback(ray_local: Any) -> None:
    nodes = ray_local.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"]
    # Every TCP port the session's GCS server and raylet listen on is a loopback one.
    session = ray_local.get_runtime_context().gcs_address
    assert session.startswith("127.0.0.1:"), session
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=True).stdout
    port = session.rsplit(":", 1)[1]
    lines = [line for line in listening.splitlines() if f":{port} " in line]
    assert lines and all("127.0.0.1" in line.split()[3] for line in lines), lines
