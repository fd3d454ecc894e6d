"""The one place the project starts or joins Ray.

Inside ``ray job submit`` (``RAY_ADDRESS`` set) a plain ``ray.init()`` joins the job's cluster.
Otherwise the project starts its own local Ray bound to the loopback interface: a local Ray that
listens on every interface (Ray's default on Linux) exposes its control and object ports to the
network, and a bare ``ray.init()`` would also join whatever ``ray start`` cluster this machine last
ran. :func:`loopback_only` is the switch; the test suite's session fixture uses it too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

#: Ray's own switch (read by ``ray._private.ray_constants``): when off, a local node takes the
#: loopback address as its IP, so every Ray process binds to 127.0.0.1.
_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only() -> None:
    """Make the next local Ray of this process (and the processes it starts) bind to 127.0.0.1."""
    os.environ[_CLUSTER_SWITCH] = "0"  # for processes started from here that import Ray afresh
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already: its value is read per call


#: Log lines of Ray and RLlib that every successful run prints and that ask nothing of the user.
BENIGN_LOG_LINES: tuple[str, ...] = (
    "Token authentication is enabled for this Ray cluster",  # we keep it on, on loopback
    "You are running PPO on the new API stack",  # we ask for it
    "has been deprecated. Use `RLModule(observation_space",  # RLlib's own call, not ours
    "Trainable.setup took",
    "Install gputil for GPU system monitoring",
    "Started a local Ray instance",
)


class _DropBenign(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in BENIGN_LOG_LINES)


def quiet_ray_logs() -> None:
    """Drop :data:`BENIGN_LOG_LINES` from Ray's log handlers in this process (idempotent)."""
    import ray  # noqa: F401  (configures the "ray" logger and its handlers)

    for name in ("ray", "ray.rllib", "ray.tune", "ray.train"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _DropBenign) for f in handler.filters):
                handler.addFilter(_DropBenign())


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join the cluster of ``RAY_ADDRESS``, or start a local Ray on 127.0.0.1 (no-op if already connected).

    Args:
        num_cpus: CPUs of a local Ray (default: all of this machine's); ignored when joining a cluster.
    """
    import ray

    if ray.is_initialized():
        return
    quiet_ray_logs()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        loopback_only()
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    quiet_ray_logs()  # init may have set up the handlers anew


def cluster_cpus() -> int:
    """CPUs of the Ray cluster this process is connected to (starting the local one if needed)."""
    import ray

    ensure_ray()
    return int(ray.cluster_resources().get("CPU", 0))


def in_ray_job() -> bool:
    """Whether this process is the driver of a ``ray job submit`` job."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def output_dir(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """The absolute output folder for ``path``, and a warning when it will not outlive a Ray job.

    A job runs in an unpacked copy of its working directory inside Ray's session folder: a relative
    path resolves there and is deleted with the session. Give the job an absolute ``--out-dir``.
    """
    absolute = Path(path).expanduser().resolve()
    if in_ray_job() and not Path(path).expanduser().is_absolute():
        return absolute, (
            f"this is a `ray job submit` job: the relative output folder {str(path)!r} resolves to {absolute}, inside "
            "Ray's session folder, which Ray deletes with the session; pass an absolute --out-dir to keep the results"
        )
    return absolute, None
