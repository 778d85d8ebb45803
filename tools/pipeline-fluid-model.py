#!/usr/bin/env python3
"""A fluid model of a pipeline step over shaped access links, for schedule questions the GPU sweep
is too dear to answer by trial (docs/gpu-sweep.md, "Session 21").

Each of S hosts has an upload and a download of the same rate; frames in flight share them by
max-min fairness, each also capped by the senders' pace (0.98 of the rate, as the sweep's). A stage
computes one operation at a time in its schedule's order, a forward when its input frame has
arrived, a backward when its gradient frame has; it sends each output as one frame, frames to the
same neighbour one after another. A step ends when every stage has finished its operations and
then the optimizer step (the clipping norm needs them all). Times are in milliseconds; a frame's
size is given as its time at the full rate.

  tools/pipeline-fluid-model.py                          # the sweep's cells at 300 and 500 Mbit/s
  tools/pipeline-fluid-model.py --forward-ms 14 --backward-ms 28 --hold 1

Schedules: gpipe (F0..F(M-1) B0..B(M-1) on every stage); last-eager (the last stage runs F_i B_i
in turn, the others GPipe: the same arithmetic); with --hold H the last stage keeps its gradient
frames until its forward input M-1-H has arrived, sending them the moment it does even while the
stage is still computing (a release the runtime would have to look for between its operations:
docs/gpu-sweep.md, "Session 21", tells how a release at the loop's own pace made a GPU run slower).
Standard library only.
"""
import argparse

PACE = 0.98  # the senders' pace as a fraction of the rate (the sweep's default)


def schedule(kind, stage, stages, micro_batches):
    eager = kind == "last-eager" and stage == stages - 1
    if eager:
        return [op for i in range(micro_batches) for op in ((True, i), (False, i))]
    return [(True, i) for i in range(micro_batches)] + [(False, i) for i in range(micro_batches)]


def fair_rates(flows):
    """Max-min fair rates of flows keyed (src, dst) over each host's upload and download, as
    fractions of the rate, each at most PACE."""
    caps, rates, left = {}, {}, set(range(len(flows)))
    for src, dst in flows:
        caps[("up", src)] = 1.0
        caps[("down", dst)] = 1.0
    while left:
        best = None
        for c, cap in caps.items():
            users = [j for j in left if ("up", flows[j][0]) == c or ("down", flows[j][1]) == c]
            if users and (best is None or cap / len(users) < best[0]):
                best = (cap / len(users), users)
        share, users = best
        share = min(share, PACE)
        for j in users:
            rates[j] = share
            left.discard(j)
            caps[("up", flows[j][0])] -= share
            caps[("down", flows[j][1])] -= share
    return rates


def run(kind, stages, micro_batches, fwd_ms, bwd_ms, cf_ms, cb_ms, opt_ms, steps, hold=None):
    ops = [schedule(kind, s, stages, micro_batches) for s in range(stages)]
    idx, done_steps = [0] * stages, [0] * stages
    running, free_at = [None] * stages, [0.0] * stages
    queues, active, arrived = {}, {}, set()  # (src, dst) -> [(size, tag)]; (src, dst) -> remaining
    finished, step_ends, clock = [], [], 0.0

    def ready(s):
        forward, i = ops[s][idx[s]]
        if forward:
            return s == 0 or ("act", done_steps[s], s, i) in arrived
        return s == stages - 1 or ("grad", done_steps[s], s, i) in arrived

    def held(key, q):
        if hold is None or key != (stages - 1, stages - 2):
            return False
        return ("act", q[0][1][1], stages - 1, micro_batches - 1 - hold) not in arrived

    while True:
        for s in range(stages):
            if running[s] is None and done_steps[s] < steps and free_at[s] <= clock and ready(s):
                forward, i = ops[s][idx[s]]
                running[s] = (clock + (cf_ms if forward else cb_ms), forward, i)
        for key, q in queues.items():
            if q and key not in active and not held(key, q):
                active[key] = q[0][0]
        keys = list(active)
        rates = fair_rates(keys)
        events = [r[0] for r in running if r] + [t for t in free_at if t > clock]
        events += [clock + active[k] / rates[j] for j, k in enumerate(keys) if rates[j] > 0]
        if not events:
            break
        now = min(events)
        for j, k in enumerate(keys):
            active[k] -= rates[j] * (now - clock)
        clock = now
        for k in [k for k in keys if active[k] <= 1e-9]:
            del active[k]
            arrived.add(queues[k].pop(0)[1])
        for s in range(stages):
            if running[s] and running[s][0] <= clock + 1e-9:
                _, forward, i = running[s]
                running[s] = None
                idx[s] += 1
                if forward and s < stages - 1:
                    queues.setdefault((s, s + 1), []).append((fwd_ms, ("act", done_steps[s], s + 1, i)))
                if not forward and s > 0:
                    queues.setdefault((s, s - 1), []).append((bwd_ms, ("grad", done_steps[s], s - 1, i)))
                if idx[s] == len(ops[s]):
                    idx[s], free_at[s] = 0, float("inf")
                    done_steps[s] += 1
                    finished.append(s)
                    if len(finished) == stages:  # the norm is known: every optimizer step runs
                        free_at = [clock + opt_ms] * stages
                        finished.clear()
                        step_ends.append(clock)
    return step_ends[-1] - step_ends[-2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=32)
    p.add_argument("--forward-ms", type=float, help="a forward frame's time at the rate (default: the cells)")
    p.add_argument("--backward-ms", type=float)
    p.add_argument("--compute-forward-ms", type=float, default=5.0, help="a stage's forward of one micro-batch")
    p.add_argument("--compute-backward-ms", type=float, default=10.0)
    p.add_argument("--optimizer-ms", type=float, default=12.0)
    p.add_argument("--hold", type=int, default=0,
                   help="last-eager holds its gradients until input M-1-HOLD has arrived (-1: sends them at once)")
    a = p.parse_args()
    # TAH-Quant forward / INT8 backward at 300 and 500 Mbit/s, fp32 at 300 and 500 (1,024 x 1,600).
    cells = [(a.forward_ms, a.backward_ms)] if a.forward_ms else [(23, 46), (14, 28), (180, 180), (108, 108)]
    hold = None if a.hold < 0 else a.hold
    for f, b in cells:
        common = (a.stages, a.micro_batches, f, b, a.compute_forward_ms, a.compute_backward_ms, a.optimizer_ms, 4)
        bound = (a.micro_batches + a.stages - 2) * (f + b) / PACE
        gpipe = run("gpipe", *common)
        eager = run("last-eager", *common)
        held = run("last-eager", *common, hold=hold)
        print(f"frames {f:g}/{b:g} ms: GPipe bound {bound:.0f} ms; step gpipe {gpipe:.0f}, last-eager {eager:.0f} "
              f"({gpipe / eager - 1:+.1%}), last-eager holding {hold} {held:.0f} ({gpipe / held - 1:+.1%})")


if __name__ == "__main__":
    main()
