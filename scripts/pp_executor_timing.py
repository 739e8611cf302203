"""Time torch's pipeline executors on their own step tables, as the GPU runs them, to check
the planner's bubble formula and its count of FSDP reductions under PP
(docs/planner-throughput.md): python scripts/pp_executor_timing.py

Two executors of torch.distributed.pipelining as TorchTitan's 2024 benchmarks ran them:
``Schedule1F1B`` (warm-up forwards, then blocking fused send/receive pairs around each backward
and forward) and ``PipelineScheduleMulti._step_microbatches`` (interleaved 1F1B: each rank
walks the global time-step table of ``_get_1f1b_rank_ops`` and, after every step's compute,
waits for that step's batched sends and receives). GPU semantics: each rank's compute and
communication are serialised (every batch is waited for before the next compute), and a
send/receive pair completes when both sides have posted it. Forward 1, backward 3 (full
checkpointing: recompute + 2), per microbatch and stage; a reduction of ``reduce`` time units
is run inside each stage's last backward, before its gradient is sent (torch before
pytorch/pytorch#166449), or not at all.
"""

from torch.distributed.pipelining.schedules import (
    _ComputationType,
    _get_1f1b_rank_ops,
    _get_warmup_ops,
)

Op = tuple  # ("C", seconds) | ("P", batch, [(kind, peer, key)]) | ("W", batch)


def run(programs: list[list[Op]]) -> float:
    """Makespan of per-rank programs: compute, post a batch of sends/receives, wait for it."""
    n = len(programs)
    pointer, clock, posted, done = [0] * n, [0.0] * n, {}, {}
    pending = {}

    def complete(rank: int, batch: int) -> float | None:
        if (rank, batch) not in done:
            start, ops = pending[(rank, batch)]
            peers = [posted.get((peer, "recv" if kind == "send" else "send", rank, key))
                     for kind, peer, key in ops]
            if any(p is None for p in peers):
                return None
            done[(rank, batch)] = max([start, *peers])
        return done[(rank, batch)]

    progress = True
    while progress:
        progress = False
        for r in range(n):
            while pointer[r] < len(programs[r]):
                op = programs[r][pointer[r]]
                if op[0] == "C":
                    clock[r] += op[1]
                elif op[0] == "P":
                    pending[(r, op[1])] = (clock[r], op[2])
                    for kind, peer, key in op[2]:
                        posted[(r, kind, peer, key)] = clock[r]
                elif (finished := complete(r, op[1])) is None:
                    break
                else:
                    clock[r] = max(clock[r], finished)
                pointer[r] += 1
                progress = True
    assert all(pointer[r] == len(programs[r]) for r in range(n)), "deadlock"
    return max(clock)


def one_f_one_b(pp: int, m: int, f: float, b: float, reduce: float) -> list[list[Op]]:
    """Schedule1F1B's order of compute and blocking p2p batches on each rank."""
    programs = []
    for r in range(pp):
        prog: list[Op] = []

        def batch(ops: list, prog: list[Op] = prog) -> None:
            if ops:
                prog.extend([("P", len(prog), ops), ("W", len(prog))])

        def fsend(i, r=r): return [("send", r + 1, ("f", i))] if r < pp - 1 else []
        def frecv(i, r=r): return [("recv", r - 1, ("f", i))] if r > 0 else []
        def bsend(i, r=r): return [("send", r - 1, ("b", i))] if r > 0 else []
        def brecv(i, r=r): return [("recv", r + 1, ("b", i))] if r < pp - 1 else []

        def backward(i: int, prog: list[Op] = prog) -> None:
            prog.append(("C", b + (reduce if i == m - 1 else 0.0)))

        warm = min(m, pp - r)
        for i in range(warm):
            batch(frecv(i))
            prog.append(("C", f))
            if i != warm - 1:
                batch(fsend(i))
        for i in range(m - warm):  # steady state: fused pairs around B and F
            batch((fsend(i + warm - 1)) + brecv(i))
            backward(i)
            batch(bsend(i) + frecv(i + warm))
            prog.append(("C", f))
        batch(fsend(m - 1) + brecv(m - warm))
        backward(m - warm)
        for i in range(m - warm + 1, m):
            batch(bsend(i - 1) + brecv(i))
            backward(i)
        batch(bsend(m - 1))
        programs.append(prog)
    return programs


def interleaved_table(pp: int, v: int, m: int) -> dict[int, list]:
    """torch's interleaved 1F1B time-step table (ScheduleInterleaved1F1B's own rule)."""
    per_round = m // max(1, m // pp)
    table = {}
    for r in range(pp):
        warm = _get_warmup_ops(r, v, per_round, pp, m, 2)

        def forward(step, r=r):
            return (step // per_round) % v * pp + r

        def backward(step, r=r, warm=warm):
            return (v - 1 - ((step - warm) // per_round) % v) * pp + r

        table[r] = _get_1f1b_rank_ops(v, pp, warm, v * m - warm, warm, r, forward, backward)
    return table


def time_steps(pp: int, v: int, m: int, f: float, b: float, reduce: float) -> list[list[Op]]:
    """PipelineScheduleMulti's executor: each time step's compute, then its p2p, waited for."""
    table, last = interleaved_table(pp, v, m), pp * v - 1
    programs = []
    for r in range(pp):
        prog: list[Op] = []
        for t, action in enumerate(table[r]):
            ops = []
            if action is not None:
                s, mb = action.stage_index, action.microbatch_index
                if action.computation_type == _ComputationType.FORWARD:
                    prog.append(("C", f))
                    ops += [("send", (r + 1) % pp, ("f", s + 1, mb))] if s < last else []
                else:
                    prog.append(("C", b + (reduce if mb == m - 1 else 0.0)))
                    ops += [("send", (r - 1) % pp, ("b", s - 1, mb))] if s > 0 else []
            ops += _receives(table, r, t, pp, v)
            if ops:
                prog += [("P", t, ops), ("W", t)]
        programs.append(prog)
    return programs


def _receives(table: dict[int, list], r: int, t: int, pp: int, v: int) -> list:
    """What rank r receives at step t: the output of the previous rank's step-t forward and
    the input gradient of the next rank's step-t backward, when the stage they feed is r's."""
    ops = []
    for peer, kind, hop in (((r - 1) % pp, "f", 1), ((r + 1) % pp, "b", -1)):
        action = table[peer][t] if t < len(table[peer]) else None
        if action is None or (action.computation_type == _ComputationType.FORWARD) != (hop > 0):
            continue
        stage = action.stage_index + hop
        if 0 <= stage < pp * v and stage % pp == r:
            ops.append(("recv", peer, (kind, stage, action.microbatch_index)))
    return ops


def main() -> None:
    f, b, reduce = 1.0, 3.0, 1.0
    print("forward 1, backward 3 per microbatch of 4 sequences and stage of 16 blocks; "
          "a rank's reduction 1 (units)")
    for name, pp, v, m in (("1F1B", 8, 1, 8), ("Interleaved1F1B", 8, 2, 16)):
        size = 8 / (m * v)  # the same local batch in m microbatches, v chunks per rank
        fb = (f * size, b * size)
        formula = (m * v + pp - 1) * sum(fb)
        if v == 1:
            plain, chained = (run(one_f_one_b(pp, m, *fb, rs)) for rs in (0.0, reduce))
        else:
            plain, chained = (run(time_steps(pp, v, m, *fb, rs)) for rs in (0.0, reduce / v))
        print(f"{name:16s} pp {pp} v {v} m {m:2d}: formula (m v + pp - 1)(F + B) = "
              f"{formula:6.2f}, executor {plain:6.2f} ({plain / formula - 1:+.1%}); with each "
              f"stage reducing before its send: +{chained - plain:.2f} "
              f"(= {(chained - plain) / reduce:.2f} x a rank's reduction)")


if __name__ == "__main__":
    main()
