"""The one place the project starts or joins Ray.

Inside ``ray job submit`` (``RAY_ADDRESS`` set) a plain ``ray.init()`` joins the job's cluster.
Otherwise the project starts its own local Ray rather than joining whatever ``ray start`` cluster
this machine last ran (a bare ``ray.init()`` would).
"""

from __future__ import annotations

import os


def ensure_ray() -> None:
    """Join the cluster of ``RAY_ADDRESS``, or start a local Ray (no-op if already connected)."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
