"""Where the time of a training step goes: an operator table (torch.profiler) and the step cut
into phases (forward with the fused output-layer loss, backward, renormalization + optimizer
step).

The phases repeat the operations of `convs2s.train.update.train_update` for one micro-batch on one
process (model forward with `target`, backward of loss / ntokens, `clip_gradients`,
`optimizer.step`, `zero_grad`) with a timer between them; the matmul share says how much of
the step the GEMMs take and at what rate they run (analytic FLOPs over their time), so the
rest is overhead outside the matrix products.

    prof = operator_profile(step, n_steps, train_flops)   # step(i) runs one training step
    phases = phase_breakdown(model, optimizer, batches, train_cfg, device)
"""

from __future__ import annotations

import time
from statistics import median

import torch

from benchmarks.machine import synchronize
from convs2s.train.optim import clip_gradients
from convs2s.train.update import autocast_for

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul")
SHAPE_OPS, SHAPE_ROWS = 6, 10  # with shapes: this many operators, each's largest shape groups


def operator_profile(step, n: int, train_flops: float, shapes: bool = False) -> dict:
    """Top operators by self time over `n` calls of step(i); `train_flops`: the analytic
    (padded) FLOPs of those n steps, to rate the matrix products. With `shapes`, also the
    largest input-shape groups of the top operators that are not matrix products (`by_shape`:
    which copies, adds and casts cost the time; recording shapes adds host time to the
    profiled steps, not GPU time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, record_shapes=shapes) as prof:
        for i in range(n):
            step(i)
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"  # microseconds
    ops, total = _ops_and_busy_time(events, cuda, key)
    mm = sum(getattr(e, key) for e in ops if e.key in MATMUL_OPS)
    rows = sorted(ops, key=lambda e: -getattr(e, key))[:20]
    counts = _launch_and_sync_counts(events, n) if cuda else {}
    out = {**counts, "ops": [{"op": e.key, "calls": e.count / n,
                              "self_ms_per_step": getattr(e, key) / 1e3 / n,
                              "share": round(getattr(e, key) / total, 4)} for e in rows],
           "busy_ms_per_step": total / 1e3 / n,  # GPU-busy (CUDA) or operator CPU time
           "matmul_share": mm / total,
           "matmul_flops": train_flops / (mm / 1e6) if mm else None}
    if shapes:
        top = [e.key for e in rows if e.key not in MATMUL_OPS][:SHAPE_OPS]
        grouped, _ = _ops_and_busy_time(prof.key_averages(group_by_input_shape=True), cuda,
                                        key)
        out["by_shape"] = {op: [{"shapes": [list(x) for x in e.input_shapes if x],
                                 "calls": e.count / n,
                                 "self_ms_per_step": round(getattr(e, key) / 1e3 / n, 3)}
                                for e in sorted((g for g in grouped if g.key == op),
                                                key=lambda g: -getattr(g, key))[:SHAPE_ROWS]]
                           for op in top}
    return out


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _launch_and_sync_counts(events, n: int) -> dict:
    """Kernels run, kernel launches and host waits for the GPU per step, read off the CUDA
    runtime calls the profile records (a blocking device-to-host copy is a wait too)."""
    from torch.autograd import DeviceType

    calls = {}
    for e in events:
        if e.device_type != DeviceType.CUDA and e.key.startswith("cuda"):
            calls[e.key] = calls.get(e.key, 0) + e.count
    kernels = sum(e.count for e in events if e.device_type == DeviceType.CUDA)
    launches = sum(v for k, v in calls.items() if "LaunchKernel" in k)
    syncs = sum(v for k, v in calls.items() if k in SYNC_CALLS) + calls.get("cudaMemcpy", 0)
    return {"kernels_per_step": kernels / n, "launches_per_step": launches / n,
            "host_syncs_per_step": syncs / n,
            "runtime_calls_per_step": {k: v / n for k, v in sorted(calls.items())}}


def _ops_and_busy_time(events, cuda: bool, key: str) -> tuple[list, float]:
    """(operator events, their total time in microseconds). On CUDA the profile lists every
    kernel twice: as a kernel event of its own and in the self device time of the operator
    that launched it. Summing all events counted each kernel twice (a matmul share of 21% was
    about 43% of GPU-busy time); the total is the kernels' time, each once, and the shares
    are of the operators."""
    if not cuda:
        return list(events), sum(getattr(e, key) for e in events) or 1.0
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    ops = [e for e in events if e.device_type != DeviceType.CUDA]
    return ops, sum(e.self_device_time_total for e in kernels) or 1.0


def phase_breakdown(model, optimizer, batches, train_cfg, device, n: int = 5) -> dict:
    """Median milliseconds per phase over n steps (after one untimed step)."""
    phases = {k: [] for k in ("forward_and_loss", "backward", "clip_and_step")}
    for i in range(n + 1):
        b = batches[i % len(batches)].to(device)
        marks = [time.perf_counter()]
        with autocast_for(device, train_cfg):
            loss, _ = model(b.src_tokens, b.src_lengths, b.prev_output_tokens,
                            target=b.target, label_smoothing=train_cfg.label_smoothing,
                            target_rows=b.target_rows)  # as the step: no device wait
        synchronize(device)
        marks.append(time.perf_counter())
        (loss / b.ntokens).backward()
        synchronize(device)
        marks.append(time.perf_counter())
        clip_gradients(model.parameters(), train_cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        marks.append(time.perf_counter())
        if i:
            for k, a, z in zip(phases, marks, marks[1:]):
                phases[k].append(z - a)
    return {k: round(1e3 * median(v), 1) for k, v in phases.items()}
