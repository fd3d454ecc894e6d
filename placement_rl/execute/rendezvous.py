"""Where the workers' sockets listen: on loopback unless the user names an address.

``torch.distributed``'s ``tcp://`` and ``env://`` rendezvous start a ``TCPStore`` server that listens
on every interface whatever host the URL names, unauthenticated; gloo's pair sockets listen on the
address the machine's host name resolves to. The launchers therefore:

* local processes (:func:`~placement_rl.execute.local.run_local`, the ``nsworker`` processes of
  :class:`~placement_rl.execute.processes.ProcessLauncher` on this machine): a ``file://`` rendezvous
  (a ``FileStore`` in the run's temporary folder, no socket) and gloo's sockets on the loopback
  interface (:func:`loopback_env`);
* Ray Train workers (:mod:`placement_rl.rl.execute`): rank 0 opens the store's listening socket on
  :data:`LOOPBACK` (:func:`listen`) and hands it to ``TCPStore`` (``master_listen_fd``), or on the address
  the user names; gloo's sockets on loopback as above;
* the emulated cluster's workers listen inside their own network namespaces, reachable from nothing else.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from typing import Any

#: The address every socket the launchers open listens on unless the user names another.
LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address: ``localhost``, ``127.0.0.0/8``, ``::1``, or an IPv4 loopback
    address mapped into IPv6 (``::ffff:127.0.0.1``, as a dual-stack socket reports it)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def loopback_ifname() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return "lo"


def loopback_env() -> dict[str, str]:
    """The environment that keeps gloo's and NCCL's sockets of one machine's workers on loopback."""
    ifname = loopback_ifname()
    return {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname}


def listen(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``host:port`` only (``port`` 0: a free port, chosen now), for a ``TCPStore``
    server (:func:`init_group`); the caller keeps it open until the store has taken it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(1024)
    except OSError:
        s.close()
        raise
    return s


def init_group(
    backend: str,
    rank: int,
    world_size: int,
    host: str,
    port: int,
    timeout_s: float,
    listener: socket.socket | None = None,
) -> None:
    """Join the default ``torch.distributed`` group through a ``TCPStore`` at ``host:port``.

    Rank 0 serves the store on ``listener`` (from :func:`listen`; the store takes it over), so it listens
    exactly where that socket does; without one, rank 0 binds a socket of its own to ``host:port`` first
    (never every interface).
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {}
    own: socket.socket | None = None
    if rank == 0:
        own = listener or listen(host, port)
        kwargs["master_listen_fd"] = own.fileno()
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, **kwargs)
    if own is not None:
        own.detach()  # the store owns the descriptor now: Python must not close it
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
