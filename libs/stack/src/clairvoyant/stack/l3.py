"""The workers' L3 as the stack sees it: which one ``CV_L3_URL`` names, and, for a Mooncake
master on this machine that nothing serves yet, the ``mooncake_master`` the stack runs for it
(free ports where the URL names none; the workers get the URL naming the ports chosen).

The stack only reads the URL's scheme and address; the workers parse and check the rest
(``clairvoyant.worker.l3``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from clairvoyant.core.logs import mask_url
from clairvoyant.stack.mooncakemaster import MooncakeMaster
from clairvoyant.stack.natsserver import port_open

LOOPBACK = frozenset({"localhost", "127.0.0.1"})


class LocalL3(NamedTuple):
    """What the stack did about the L3 before starting the workers."""

    worker_url: str  # CV_L3_URL for the workers: the given one, with the started master's ports
    description: str  # for the log: "L3: file /var/l3", "L3: none", ...
    master: MooncakeMaster | None  # a master for the stack to start, supervise and stop


def l3_summary(url: str) -> str:
    """``L3: <kind> <where>`` for the log, without passwords."""
    if not url:
        return "L3: none"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return f"L3: file {parts.path}"
    if scheme == "memory":
        return "L3: memory (each worker its own)"
    if scheme == "redis":
        return f"L3: redis {parts.hostname}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"
    if scheme == "mooncake":
        metadata = dict(parse_qsl(parts.query)).get("metadata", "the master's default")
        return f"L3: mooncake, master {parts.netloc}, metadata {metadata}"
    return f"L3: {mask_url(url)} (unknown scheme: the workers will refuse it)"


def wants_local_master(url: str) -> bool:
    """A ``mooncake://`` URL whose master is on this machine."""
    parts = urlsplit(url)
    return parts.scheme.lower() == "mooncake" and (parts.hostname or "") in LOOPBACK


def plan_master(url: str, log_path: Path | None = None) -> tuple[MooncakeMaster, str]:
    """The master to start for ``url`` (its port and its metadata server's where the URL names
    them, free ones elsewhere) and the workers' URL naming both."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    metadata_port = None
    if "metadata" in params:
        metadata = urlsplit(params["metadata"])
        if (metadata.hostname or "") in LOOPBACK:
            metadata_port = metadata.port
    master = MooncakeMaster(rpc_port=parts.port, metadata_port=metadata_port, log_path=log_path)
    params["metadata"] = master.metadata_url
    return master, urlunsplit((parts.scheme, master.address, parts.path, urlencode(params, safe=":/"), ""))


def plan_local_l3(url: str, var_dir: Path) -> LocalL3:
    """What the stack does about ``url``: a ``mooncake_master`` to start (not started yet) when
    the URL wants one on this machine and nothing answers at its address; otherwise nothing but
    a line for the log."""
    url = url.strip()
    if not wants_local_master(url):
        return LocalL3(url, l3_summary(url), None)
    port = urlsplit(url).port
    if port and port_open("127.0.0.1", port):
        return LocalL3(url, f"{l3_summary(url)} (already running; not started here)", None)
    master, worker_url = plan_master(url, log_path=var_dir / "mooncake-master.log")
    return LocalL3(worker_url, f"{l3_summary(worker_url)} (started here; log {master.log_path})", master)
