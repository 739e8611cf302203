"""The links a parallel group's collectives run over, and what a transfer costs on one.

A ring all-gather or reduce-scatter sends (n-1)/n of the data from each rank, in n-1 ring
steps; each step costs its bytes at the link's rate plus a hop latency. A group whose ranks fit
in one node uses the intra-node link, otherwise the inter-node one, each at the rate of a
measured curve for its collective and message size where the GPU has one (a hardware profile:
``GPU.collective_gbps``; ``GPU.intra_node_gbps_by_message``). communication.py adds up each
dimension's transfers; ring.py (context parallel's ring) and step_time.py read them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.inputs import Cluster


@dataclasses.dataclass
class Comm:
    dim: str
    group: int
    link: str
    bandwidth_gbps: float
    bytes_per_step: float
    hops: float = 0.0
    """Ring steps per optimizer step, each costing ``latency_s``."""
    latency_s: float = 0.0
    """Seconds one ring step (hop) of this link costs beside its bytes (GPU.*_latency_s)."""

    @property
    def seconds(self) -> float:
        return self.transfer(self.bytes_per_step, self.hops)

    def transfer(self, nbytes: float, hops: float) -> float:
        """Seconds ``nbytes`` take over this group's link in ``hops`` ring steps."""
        return nbytes / (self.bandwidth_gbps * 1e9) + hops * self.latency_s


def ring_volume(n: int, nbytes: float) -> float:
    """Bytes each rank sends in a ring all-gather or reduce-scatter of ``nbytes`` in total."""
    return (n - 1) / n * nbytes


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")
"""The collectives a layout's dimensions use, as ``GPU.collective_gbps`` names them."""


def link(cluster: Cluster, span: int, message_bytes: float, kind: str = "all_gather"
         ) -> tuple[str, float, float]:
    """The link, its GB/s for ``message_bytes`` a ring step of collective ``kind`` and its hop
    latency for a group spanning ``span`` consecutive ranks: a measured curve of that
    collective on that link (``GPU.collective_gbps``, a hardware profile) first, then the
    intra-node curve, then the nominal rate."""
    gpu = cluster.gpu
    scope = "intra" if span <= cluster.gpus_per_node else "inter"
    measured = rate_at(dict(gpu.collective_gbps).get(f"{kind}/{scope}", ()), message_bytes)
    if scope == "intra":
        rate = measured or rate_at(gpu.intra_node_gbps_by_message, message_bytes) \
            or gpu.intra_node_gbps
        return "intra-node", rate, gpu.intra_node_latency_s
    return "inter-node", measured or gpu.inter_node_gbps, gpu.inter_node_latency_s


def rate_at(curve: tuple[tuple[float, float], ...], message_bytes: float) -> float:
    """GB/s at ``message_bytes`` on a measured (bytes, GB/s) curve, linear in log size between
    its points, its end points held beyond them; 0.0 without a curve."""
    if not curve:
        return 0.0
    size = max(message_bytes, 1.0)
    if size <= curve[0][0]:
        return curve[0][1]
    for (lo, lo_rate), (hi, hi_rate) in itertools.pairwise(curve):
        if size <= hi:
            share = math.log(size / lo) / math.log(hi / lo)
            return lo_rate + share * (hi_rate - lo_rate)
    return curve[-1][1]
