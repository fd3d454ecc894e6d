"""`ray job submit` of a training run, exactly as the README shows, against a head this test starts.

The head gets its own temp dir and free ports, and is stopped by the PID of the `ray start --block`
process this test launched (never `ray stop`: other Ray instances may be running on the machine).
It runs under Ray's token authentication (the README's ``RAY_AUTH_MODE=token``) with a token this
test generates and hands to the head and the job client alike (``RAY_AUTH_TOKEN``), so it needs no
``~/.ray/auth_token``. ``ray`` and ``placement-rl`` are the scripts installed beside this Python.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).with_name  # the environment's scripts, whatever PATH says


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def auth_env() -> dict[str, str]:
    """The environment of the head and the job client: token authentication with a fresh token."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    return env


@pytest.fixture()
def ray_head(auth_env: dict[str, str]) -> Iterator[str]:
    """A fresh Ray head (dashboard on a free port) under token authentication; yields the job-server address."""
    for script in ("ray", "placement-rl"):
        if not BIN(script).is_file():
            pytest.fail(f"no `{script}` beside {sys.executable}; install the project with its dependencies")
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
    # Ray refuses a port that falls in the workers' range or is taken twice: draw the range first,
    # then every named port outside it and apart from the others
    first_worker = _free_port()
    while first_worker + 200 > 65535:
        first_worker = _free_port()
    taken = set(range(first_worker, first_worker + 201))
    ports: dict[str, int] = {}
    for name in names:
        port = _free_port()
        while port in taken:
            port = _free_port()
        ports[name] = port
        taken.add(port)
    cmd = [
        str(BIN("ray")),
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
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=auth_env)
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


def test_ray_job_submit_trains(
    ray_head: str, auth_env: dict[str, str], tiny_yaml: Path, tmp_path: Path, repo_root: Path
) -> None:
    # The head enforces the token: a request without it is refused.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{ray_head}/api/jobs/", timeout=10)
    assert refused.value.code in (401, 403)
    config = tmp_path / "job.yaml"
    config.write_text(tiny_yaml.read_text().replace(str(tiny_yaml.parent / "run"), str(tmp_path / "run")))
    proc = subprocess.run(
        [
            str(BIN("ray")),
            "job",
            "submit",
            "--address",
            ray_head,
            "--working-dir",
            ".",
            "--",
            str(BIN("placement-rl")),
            "train",
            str(config),
            "--iterations",
            "2",
        ],
        cwd=repo_root,
        env=auth_env,
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
