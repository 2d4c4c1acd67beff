"""Where the time of a training step goes: an operator table (torch.profiler) and the step cut
into phases (forward with the fused output-layer loss, backward, renormalization + optimizer
step).

The phases repeat the operations of `convs2s.train.update.train_update` for one micro-batch on one
process (model forward with `target`, backward of loss / ntokens, `clip_gradients`,
`optimizer.step`, `zero_grad`) with a timer between them; the matmul share says how much of
the step the products take (the GEMMs and, with the library's convolution, its forward and
backward kernels) and at what rate they run (analytic FLOPs over their time), so the rest is
overhead outside the products. On CUDA each profiled step is one `record_function` range
(STEP_RANGE): host waits are counted inside those ranges only (the profiler's own synchronize
at its exit is not a step's).

    prof = operator_profile(step, n_steps, train_flops)   # step(i) runs one training step
    phases = phase_breakdown(model, optimizer, batches, train_cfg, device)
"""

from __future__ import annotations

import re
import time
from statistics import median

import torch

from benchmarks.machine import synchronize
from convs2s.train.optim import clip_gradients
from convs2s.train.update import autocast_for

# (the in-place forms too: the fused loss's output-layer weight gradient is an addmm_, 8-9% of
# a CPU step, which the profile counted as other work until 2026-12-07)
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
              "aten::baddbmm_", "aten::addbmm", "aten::addbmm_", "aten::matmul")
SHAPE_OPS, SHAPE_ROWS = 6, 10  # with shapes: this many operators, each's largest shape groups
# The convolutions' operators, forward and backward, by whatever name the device runs them:
# cuDNN's aten::cudnn_convolution and aten::convolution_backward (its kernels run under that op,
# not under an op of their own), oneDNN's aten::mkldnn_convolution on a CPU, the slow paths'
# aten::_slow_conv2d_*, aten::thnn_conv2d, aten::conv_tbc. With `--conv native` they are about
# 62% of the En-Fr model's FLOPs; counted as products, the FLOPs are rated over their time too.
# Their parents (aten::conv2d -> aten::convolution -> aten::_convolution) match as well: the
# times summed are self times, each kernel under one operator only, so nothing counts twice.
_CONV = re.compile(r"aten::(conv|_conv(olution|_depthwise)|.*(convolution|slow_conv|thnn_conv))")
STEP_RANGE = "convs2s.profiled_step"  # the record_function range around each profiled step


def is_product(op: str) -> bool:
    """Whether an operator is a matrix product or a convolution (its FLOPs are products)."""
    return op in MATMUL_OPS or bool(_CONV.match(op))


def operator_profile(step, n: int, train_flops: float, shapes: bool = False) -> dict:
    """Top operators by self time over `n` calls of step(i); `train_flops`: the analytic
    (padded) FLOPs of those n steps, to rate the products (matrix products and convolutions,
    `is_product`; `product_ops` lists the time of each). With `shapes`, also the largest
    input-shape groups of the top operators that are not products (`by_shape`: which copies,
    adds and casts cost the time; recording shapes adds host time to the profiled steps, not
    GPU time)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, record_shapes=shapes) as prof:
        for i in range(n):
            with record_function(STEP_RANGE):  # the step's bounds, for its host waits
                step(i)
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"  # microseconds
    ops, total = _ops_and_busy_time(events, cuda, key)
    products = {e.key: getattr(e, key) for e in ops if is_product(e.key) and getattr(e, key)}
    mm = sum(products.values())
    rows = sorted(ops, key=lambda e: -getattr(e, key))[:20]
    counts = _launch_and_sync_counts(prof.events(), n) if cuda else {}
    copies = copies_by_caller(prof.events(), n, cuda)
    out = {**counts, **copies, "ops": [{"op": e.key, "calls": e.count / n,
                              "self_ms_per_step": getattr(e, key) / 1e3 / n,
                              "share": round(getattr(e, key) / total, 4)} for e in rows],
           "busy_ms_per_step": total / 1e3 / n,  # GPU-busy (CUDA) or operator CPU time
           # the products: matrix products and convolutions (the field names are older)
           "matmul_share": mm / total,
           "matmul_flops": train_flops / (mm / 1e6) if mm else None,
           "product_ops": {k: round(v / 1e3 / n, 3)
                           for k, v in sorted(products.items(), key=lambda kv: -kv[1])}}
    if not mm and counts.get("graph_launches_per_step"):
        out["products_note"] = ("the step replays CUDA graphs: its products ran inside them, "
                                "under no operator the host saw, so matmul_share / matmul_flops "
                                "say nothing here (busy_ms_per_step and the kernels do)")
    if shapes:
        top = [e.key for e in rows if not is_product(e.key)][:SHAPE_OPS]
        grouped, _ = _ops_and_busy_time(prof.key_averages(group_by_input_shape=True), cuda,
                                        key)
        out["by_shape"] = {op: [{"shapes": [list(x) for x in e.input_shapes if x],
                                 "calls": e.count / n,
                                 "self_ms_per_step": round(getattr(e, key) / 1e3 / n, 3)}
                                for e in sorted((g for g in grouped if g.key == op),
                                                key=lambda g: -getattr(g, key))[:SHAPE_ROWS]]
                           for op in top}
    return out


# A copy or cast is one operator, aten::copy_, whatever asked for it: autocast's cast of a weight,
# the backward's cast of its gradient back to float32, the copy a reshape of a strided tensor
# makes. These operators only pass the copy on; the first ancestor that is not one of them asked.
# So does the autograd Function torch.library wraps a custom operator's forward in
# ("GeneratedBackwardFor_<op>", under the operator itself; its backward's name ends in
# "Backward").
_COPY_WRAPPERS = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone",
                  "aten::contiguous")


def _passes_copy_on(name: str) -> bool:
    return name in _COPY_WRAPPERS or (name.startswith("GeneratedBackwardFor_")
                                      and not name.endswith("Backward"))


FROM_PYTHON = "(the step's Python code)"  # a copy whose first caller is no operator
COPY_ROWS = 12


def copies_by_caller(events, n: int, cuda: bool) -> dict:
    """Per step, from the profile's events (`prof.events()`): how many copies the step makes
    (`aten::copy_` calls) and, for the COPY_ROWS callers that cost the most, the calls and the
    copies' own time (GPU time of their kernels on CUDA, operator CPU time otherwise). A
    caller is the nearest enclosing operator or autograd function that is not just passing the
    copy on (`_passes_copy_on`): aten::linear for autocast's weight casts, ToCopyBackward0 for a
    gradient cast back, aten::reshape for a reshape's copy, convs2s::output_loss for the fused
    loss's own casts; a copy that the model's Python code asks for itself (`x.float()`) has
    FROM_PYTHON, as the profile records no Python frames. A `record_function` range (other
    than the step's own) or an autograd engine frame can be a caller too. Eager copies only:
    a step replayed from CUDA graphs or compiled copies inside the graph or the generated
    kernels, which this leaves out; a copy through a temporary (host-device and another dtype)
    counts once for each aten::copy_ it makes."""
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    calls, time_us = {}, {}
    for e in events:
        if e.name != "aten::copy_" or getattr(e, "is_user_annotation", False):
            continue
        p = e.cpu_parent
        while p is not None and _passes_copy_on(p.name):
            p = p.cpu_parent
        caller = FROM_PYTHON if p is None or p.name == STEP_RANGE else p.name
        calls[caller] = calls.get(caller, 0) + 1
        time_us[caller] = time_us.get(caller, 0.0) + getattr(e, key)
    rows = sorted(calls, key=lambda c: (-time_us[c], -calls[c], c))[:COPY_ROWS]
    return {"copies_per_step": sum(calls.values()) / n,
            "copies_by_caller": [{"caller": c, "calls": calls[c] / n,
                                  "ms_per_step": round(time_us[c] / 1e3 / n, 3)}
                                 for c in rows]}


# Host waits for the GPU: the runtime's and the driver's synchronizes, and a blocking copy.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cudaMemcpy")
_API_CALL = re.compile(r"cu(da)?[A-Z]")  # cudaX: the CUDA runtime's calls; cuX: the driver's


def _launch_and_sync_counts(events, n: int) -> dict:
    """Per step, from the profile's events (`prof.events()`, not averaged: each with its time):
    GPU work (kernels, and the memcpys and memsets apart), kernel launches (the runtime's
    cudaLaunchKernel* and the driver's cuLaunchKernel*, how Triton's kernels are launched), CUDA
    graph launches, and host waits for the GPU inside the profiled steps' ranges (STEP_RANGE).
    A wait outside them, such as the profiler's own synchronize as it exits, is no step's:
    `host_syncs_outside_steps` counts those, in all."""
    from torch.autograd import DeviceType

    # a record_function range shows on the GPU too, as an annotation spanning its kernels
    device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    memcpys = sum(e.name.startswith("Memcpy") for e in device)
    memsets = sum(e.name.startswith("Memset") for e in device)
    host = [e for e in events if e.device_type != DeviceType.CUDA]
    calls = {}
    for e in host:
        if _API_CALL.match(e.name):
            calls[e.name] = calls.get(e.name, 0) + 1
    steps = [e.time_range for e in host if e.name == STEP_RANGE]
    # the backward runs on autograd's device thread: within the range's time, not its thread
    waits = [e.time_range.start for e in host if e.name in SYNC_CALLS]
    by_step = [sum(r.start <= t <= r.end for t in waits) for r in steps]
    inside = sum(any(r.start <= t <= r.end for r in steps) for t in waits)
    # (the launch calls the profiler records; a library that launches inside its own call,
    # cuBLASLt for one, adds kernels without a call here: kernels_per_step is the GPU's count)
    launches = sum(v for k, v in calls.items() if "Launch" in k and "Kernel" in k)
    graphs = sum(v for k, v in calls.items() if k in ("cudaGraphLaunch", "cuGraphLaunch"))
    return {"kernels_per_step": (len(device) - memcpys - memsets) / n,
            "memcpys_per_step": memcpys / n, "memsets_per_step": memsets / n,
            "launches_per_step": launches / n, "graph_launches_per_step": graphs / n,
            "host_syncs_per_step": inside / n,
            # each profiled step's own: one wait in one step of three (a first step's
            # allocation, say) reads 0.333 a step, as one wait in each would read 1
            "host_syncs_by_step": by_step,
            "host_syncs_outside_steps": len(waits) - inside,
            "profiled_steps": len(steps),
            "runtime_calls_per_step": {k: v / n for k, v in sorted(calls.items())}}


def _ops_and_busy_time(events, cuda: bool, key: str) -> tuple[list, float]:
    """(operator events, their total time in microseconds). On CUDA the profile lists every
    kernel twice: as a kernel event of its own and in the self device time of the operator
    that launched it. Summing all events counted each kernel twice (a matmul share of 21% was
    about 43% of GPU-busy time); the total is the kernels' time (memcpys and memsets
    included), each once, and the shares are of the operators. record_function ranges (the
    steps' own, STEP_RANGE) are neither operators nor GPU work: on the GPU such a range is an
    annotation spanning its kernels, which would count them again."""
    events = [e for e in events if not e.is_user_annotation]
    if not cuda:
        return events, sum(getattr(e, key) for e in events) or 1.0
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    ops = [e for e in events if e.device_type != DeviceType.CUDA]
    return ops, sum(e.self_device_time_total for e in kernels) or 1.0


def phase_breakdown(model, optimizer, batches, train_cfg, device, n: int = 5) -> dict:
    """Median milliseconds per phase over n steps (after one untimed step)."""
    phases = {k: [] for k in ("forward_and_loss", "backward", "clip_and_step")}
    for i in range(n + 1):
        b = batches[i % len(batches)].to(device)
        synchronize(device)  # (the batch's copy, queued without a wait, is no phase of it)
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
