"""`ray job submit` of a training run, exactly as the README shows, against a head this test starts.

The head gets its own temp dir and free ports, and is stopped by the PID of the `ray start --block`
process this test launched (never `ray stop`: other Ray instances may be running on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def ray_head() -> Iterator[str]:
    """A fresh Ray head (dashboard on a free port); yields the job-server address."""
    if shutil.which("ray") is None:
        pytest.fail("the `ray` command is not on PATH; install the project with its dependencies")
    temp_dir = tempfile.mkdtemp(prefix="prl")  # short: Ray's unix socket paths have a length limit
    names = (
        "port",
        "dashboard-port",
        "ray-client-server-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
        "node-manager-port",
        "object-manager-port",
    )
    ports = {name: _free_port() for name in names}
    first_worker = _free_port()
    cmd = [
        "ray",
        "start",
        "--head",
        "--block",
        "--num-cpus=2",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--temp-dir={temp_dir}",
        f"--min-worker-port={first_worker}",
        f"--max-worker-port={first_worker + 200}",
        *(f"--{k}={v}" for k, v in ports.items()),
    ]
    log = open(Path(temp_dir) / "head.log", "w")
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 90
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            try:
                direct.open(f"{address}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # an answer (401 under token auth): the dashboard is up
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Ray head did not start: {(Path(temp_dir) / 'head.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(1)
        yield address
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_trains(ray_head: str, tiny_yaml: Path, tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(tiny_yaml.read_text().replace(str(tiny_yaml.parent / "run"), str(tmp_path / "run")))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            "--address",
            ray_head,
            "--working-dir",
            ".",
            "--",
            "placement-rl",
            "train",
            str(config),
            "--iterations",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "succeeded" in output
    assert "[tiny] iter 2/2" in output  # the progress line, printed by the job's driver
    assert (tmp_path / "run" / "checkpoint_final" / "rllib_checkpoint.json").is_file()
    assert len((tmp_path / "run" / "progress.csv").read_text().splitlines()) == 3  # header + 2 iterations
