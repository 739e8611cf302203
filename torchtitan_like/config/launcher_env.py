"""The launcher's environment: the variables run_train.sh reads, read and checked in one place.

run_train.sh passes them to torchrun (``--nproc_per_node``, ``--nnodes``, ``--node_rank``,
``--rdzv_endpoint``, ``--max-restarts``, ``--local-ranks-filter``); preflight.py checks them
first, so a bad value is one ``config error:`` line naming the variable (exit 2) before bash
does arithmetic on it or torchrun starts, and the world size the config is checked against is
theirs. ``ttl-plan --config`` reads the world size the same way. Empty means unset, as in
run_train.sh (``${NPROC:-...}``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from torchtitan_like.config.errors import ConfigError

WHOLE = re.compile(r"0|[1-9][0-9]*")
"""A whole number as bash and torchrun read it alike: digits, no sign, no leading zero (bash
reads 08 as a bad octal number)."""


@dataclasses.dataclass(frozen=True)
class LauncherEnv:
    nproc: int = 1
    """Processes on this node (NPROC, alias NGPU)."""
    nnodes: int = 1
    """Nodes of the job (NNODES), each running the same command."""
    node_rank: int = 0
    """This node's index (NODE_RANK)."""
    rdzv_endpoint: str = ""
    """host[:port] of the rendezvous on several nodes (RDZV_ENDPOINT)."""
    max_restarts: int = 0
    """Restarts of the job after a failure a restart can cure (MAX_RESTARTS)."""
    log_ranks: tuple[int, ...] = (0,)
    """Local ranks whose output is shown (LOG_RANK)."""
    unused: tuple[str, ...] = ()
    """Variables set that one node does not read (RDZV_ENDPOINT, RDZV_ID)."""

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def _whole(environ: Mapping[str, str], name: str, default: int, low: int, what: str,
           problems: list[str]) -> int:
    value = environ.get(name) or ""
    if not value:
        return default
    if not WHOLE.fullmatch(value) or int(value) < low:
        problems.append(f"{name}={value}: {what} must be a whole number >= {low}")
        return default
    return int(value)


def _endpoint_problem(value: str) -> str | None:
    """Why ``value`` is not ``host:port`` (an IPv6 host in brackets), else None."""
    host, colon, port = value.rpartition(":")
    if colon and host and WHOLE.fullmatch(port) and 1 <= int(port) <= 65535:
        return None
    return (f"RDZV_ENDPOINT={value}: expected host:port of node 0's rendezvous, e.g. "
            "node0:29500 (port 1..65535)")


def _counts(environ: Mapping[str, str], problems: list[str]) -> tuple[int, int]:
    """(processes per node, nodes)."""
    name = "NPROC" if environ.get("NPROC") else "NGPU"
    return (_whole(environ, name, 1, 1, "processes on this node", problems),
            _whole(environ, "NNODES", 1, 1, "the number of nodes", problems))


def _raise(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems:\n  " + "\n  ".join(problems))


def world_size_of(environ: Mapping[str, str]) -> int:
    """NPROC (or NGPU) x NNODES, checked: the world size run_train.sh would launch."""
    problems: list[str] = []
    nproc, nnodes = _counts(environ, problems)
    _raise(problems)
    return nproc * nnodes


def read_launcher_env(environ: Mapping[str, str]) -> LauncherEnv:
    """The variables of run_train.sh's command line, checked; ConfigError naming every bad one
    (one line each)."""
    problems: list[str] = []
    nproc, nnodes = _counts(environ, problems)
    node_rank = _whole(environ, "NODE_RANK", 0, 0, "this node's index", problems)
    restarts = _whole(environ, "MAX_RESTARTS", 0, 0, "restarts after a failure", problems)
    endpoint = environ.get("RDZV_ENDPOINT") or ""
    unused: tuple[str, ...] = ()
    if nnodes > 1:
        if not environ.get("NODE_RANK"):
            problems.append(f"NNODES={nnodes} needs NODE_RANK, this node's index in "
                            f"0..{nnodes - 1}")
        elif node_rank >= nnodes:
            problems.append(f"NODE_RANK={node_rank}: must be a node index in 0..{nnodes - 1} "
                            f"(NNODES={nnodes})")
        if not endpoint:
            problems.append(f"NNODES={nnodes} needs RDZV_ENDPOINT=host:port, node 0's "
                            "rendezvous (the same on every node)")
        elif problem := _endpoint_problem(endpoint):
            problems.append(problem)
    else:
        if node_rank > 0:
            problems.append(f"NODE_RANK={node_rank}, but NNODES={nnodes}: set NNODES to the "
                            "number of nodes")
        unused = tuple(v for v in ("RDZV_ENDPOINT", "RDZV_ID") if environ.get(v))
    log_ranks = _log_ranks(environ.get("LOG_RANK") or "0", nproc, problems)
    _raise(problems)
    return LauncherEnv(nproc, nnodes, node_rank, endpoint, restarts, log_ranks, unused)


def _log_ranks(value: str, nproc: int, problems: list[str]) -> tuple[int, ...]:
    items = value.split(",")
    if not all(WHOLE.fullmatch(item) and int(item) < nproc for item in items):
        problems.append(f"LOG_RANK={value}: expected local ranks of this node, comma-separated, "
                        f"each in 0..{nproc - 1} (NPROC={nproc})")
        return (0,)
    return tuple(int(item) for item in items)
