"""Benchmarks: the analytic FLOP count against torch's own counter, and smoke runs of each
benchmark with tiny settings that must write a complete result JSON (no timing assertions:
timings depend on the machine and its load).

    timeout 900 .venv/bin/python -m pytest tests/test_benchmarks.py -q -x          # fast ones
    timeout 900 .venv/bin/python -m pytest tests/test_benchmarks.py -q -m slow     # Ray run
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.flops import TRAIN_MULTIPLIER, batch_flops, decoder_flops
from benchmarks.report import RESULTS_DIR as RESULTS
from convs2s.config import EOS, PAD, PRESETS, ModelConfig
from convs2s.model.network import ConvS2S, inference_copy

# Widths change (residual projections), a k=1 and a k=5 layer, attention in one layer only.
ODD = ModelConfig(embed_dim=16, encoder_layers=[(16, 3), (24, 3), (24, 1)],
                  decoder_layers=[(16, 3), (32, 5)], out_embed_dim=8, dropout=0.0,
                  decoder_attention=(True, False))


def _check_result(path, benchmark: str) -> dict:
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == benchmark
    assert {"created", "command", "settings", "machine", "load_average", "quiet", "results",
            "notes"} <= set(doc)
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["versions"]["python"]
    # the preprocessing driver stays torch-free, so its memory is the pipeline's own; the cost
    # model builds models on the meta device only
    if benchmark != "cost_model":
        assert ("torch" in doc["machine"]["versions"]) == (benchmark != "preprocess")
    assert len(doc["load_average"]["before"]) == 3
    assert doc["command"].startswith(f"python -m benchmarks.{benchmark}")
    return doc


def test_forward_and_training_flops_match_torch_counter():
    V, B, S, T = 50, 3, 7, 5
    model = ConvS2S(ODD, V, V)
    src, prev = torch.randint(4, V, (B, S)), torch.randint(4, V, (B, T))
    with FlopCounterMode(display=False) as fwd:
        model(src, torch.full((B,), S), prev)
    with FlopCounterMode(display=False) as train:
        logits, _ = model(src, torch.full((B,), S), prev)
        logits.sum().backward()
    expected = batch_flops(ODD, V, [S] * B, [T] * B)
    assert expected["useful"] == expected["padded"] == fwd.get_total_flops()
    assert TRAIN_MULTIPLIER * expected["useful"] == train.get_total_flops()


def test_useful_flops_count_real_tokens_only():
    """`useful` counts real tokens; `padded` the padded tensors the step computes on, but the
    output projection on padded target rows, which the fused loss never computes."""
    V = 50
    padded = batch_flops(ODD, V, [7, 3], [5, 2])
    projection = 2 * ODD.out_embed_dim * V
    assert padded["useful"] < padded["padded"] == \
        batch_flops(ODD, V, [7, 7], [5, 5])["useful"] - 3 * projection  # (5 - 2 pad rows)


def test_incremental_step_flops_match_decoder_count():
    V, B, S = 50, 2, 6
    net = inference_copy(ConvS2S(ODD, V, V))
    enc = net.encode(torch.randint(4, V, (B, S)), torch.full((B,), S))
    state = net.init_state(enc, beam_size=1)
    net.decode_step(torch.full((B,), 2), state)  # buffers filled; count a later step
    with FlopCounterMode(display=False) as step:
        net.decode_step(torch.randint(4, V, (B,)), state)
    assert step.get_total_flops() == B * decoder_flops(ODD, V, S)


def test_large_budgets_are_cut_from_a_resampled_corpus_as_full_as_a_large_corpus_cuts_them(
        shared_data, tmp_path):
    """The 6,003 newstest sentences cut into 24,000-token batches hold lengths far apart in
    each (the paper's corpus fills them as full as 3,000-token ones); --resample N draws N pairs
    with replacement first: fuller batches, and only those the run steps kept."""
    import argparse

    from benchmarks.training import make_batches

    args = argparse.Namespace(data=shared_data, bpe_vocab=1000, vocab=1000, max_tokens=24000,
                              seed=1, resample=0, warmup=2, steps=3, profile=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole, info = make_batches(args, tmp_path / "a")
    drawn, resampled = make_batches(argparse.Namespace(**{**vars(args), "resample": 100_000}),
                                    tmp_path / "b")
    assert len(drawn) == 6 and resampled["resampled_to"] == 100_000
    assert resampled["fill"] > info["fill"] + 0.03, (resampled["fill"], info["fill"])
    assert all(sum(map(len, s)) > 0 for s, _ in drawn)


def test_training_benchmark_writes_result(shared_data, tmp_path):
    from benchmarks import training

    out = tmp_path / "training.json"
    training.main(["--preset", "tiny", "--steps", "2", "--warmup", "1", "--bpe-vocab", "500",
                   "--max-tokens", "600", "--peak-sizes", "128", "--profile", "1",
                   "--profile-shapes", "--data", str(shared_data), "--out", str(out)])
    r = _check_result(out, "training")["results"]
    assert r["steps"] == 2 and len(r["per_step"]) == 2
    assert 0 < r["tgt_tokens_per_step"] and r["tgt_tokens_per_s"] > 0
    assert 0 < r["achieved_flops"] <= r["achieved_flops_padded"]
    assert r["fraction_of_peak"] == pytest.approx(r["achieved_flops"] / r["peak_flops"])
    assert r["tgt_tokens_per_s_best"] >= r["tgt_tokens_per_s"]
    prof = r["profile"]
    assert prof["ops"] and all(0 <= p["share"] <= 1 for p in prof["ops"])
    assert 0 < prof["matmul_share"] < 1 and prof["matmul_flops"] > 0
    assert set(prof["phases_ms"]) == {"forward_and_loss", "backward", "clip_and_step"}
    # the top non-matmul operators by input shape, each group's time within its operator's
    by_op = {p["op"]: p["self_ms_per_step"] for p in prof["ops"]}
    assert prof["by_shape"] and not set(prof["by_shape"]) & {"aten::mm", "aten::addmm"}
    for op, groups in prof["by_shape"].items():
        assert groups and all(g["calls"] > 0 for g in groups)
        assert sum(g["self_ms_per_step"] for g in groups) <= by_op[op] * 1.01 + 1e-3
    assert any(g["shapes"] for groups in prof["by_shape"].values() for g in groups)
    assert all(map(math.isfinite, r["loss_first_last"]))  # finite losses, not NaN
    assert r["static_shapes"] == 0 and r["padding_factor"] == 1.0 and not r["shape_warmup_step_s"]


def test_a_profile_that_fails_keeps_the_timed_figures_and_says_why(shared_data, tmp_path,
                                                                    monkeypatch):
    """The profile runs after the timing (a lent GPU runs it once): a failure in the profiler's
    own code is recorded beside the step times, not in place of the whole result; and the
    timed figures are on disk before the profile starts, so that a step cut off inside it (its
    limit, the lease's) keeps them."""
    from benchmarks import training

    out = tmp_path / "training.json"
    seen = []

    def broken(*args, **kwargs):
        seen.append(json.loads(out.read_text())["results"])
        raise RuntimeError("profiler event without a device time")

    monkeypatch.setattr(training, "phase_breakdown", broken)
    training.main(["--preset", "tiny", "--steps", "2", "--warmup", "1", "--bpe-vocab", "500",
                   "--max-tokens", "600", "--peak-sizes", "128", "--profile", "1",
                   "--data", str(shared_data), "--out", str(out)])
    (before,) = seen
    assert before["steps"] == 2 and before["tgt_tokens_per_s"] > 0
    assert before["profile"] == {"pending": "the profile runs after the timing"}
    assert [p.name for p in tmp_path.iterdir()] == ["training.json"]  # one file, rewritten
    r = _check_result(out, "training")["results"]
    assert r["steps"] == 2 and r["tgt_tokens_per_s"] > 0 and r["fraction_of_peak"] > 0
    assert r["profile"]["error"] == "RuntimeError: profiler event without a device time"
    assert r["profile"]["ops"]  # what the profile had measured before it failed


def test_the_training_benchmark_steps_each_shape_once_before_timing_cudnn_convolutions(
        shared_data, tmp_path):
    """`--conv native`: cuDNN plans each new input shape (about 0.1 s a shape on a GPU, which
    nearly every 3,000-token batch is), the windows' GEMMs do not: each timed shape is stepped
    once before the timing, as static shapes' are, so the step is timed, not the planning."""
    from benchmarks import training

    out = tmp_path / "training.json"
    training.main(["--preset", "tiny", "--steps", "3", "--warmup", "1", "--bpe-vocab", "500",
                   "--max-tokens", "600", "--peak-sizes", "128", "--conv", "native",
                   "--data", str(shared_data), "--out", str(out)])
    r = _check_result(out, "training")["results"]
    assert r["conv"] == "native" and r["static_shapes"] == 0
    assert 1 <= len(r["shape_warmup_step_s"]) <= r["timed_shapes"] <= 3


def test_training_benchmark_pads_to_static_shapes_and_steps_each_shape_first(shared_data,
                                                                               tmp_path):
    """`--static-shapes M` (the form a CUDA-graph step needs): the step trains batches padded
    to few shapes, each timed shape is stepped once before the timing (its graph is recorded
    then), and the padding it costs is reported; tokens and flops stay the batches' own."""
    from benchmarks import training

    out = tmp_path / "training.json"
    training.main(["--preset", "tiny", "--steps", "4", "--warmup", "1", "--bpe-vocab", "500",
                   "--max-tokens", "600", "--peak-sizes", "128", "--static-shapes", "16",
                   "--data", str(shared_data), "--out", str(out)])
    r = _check_result(out, "training")["results"]
    assert r["static_shapes"] == 16 and r["padding_factor"] > 1.0
    assert 1 <= r["timed_shapes"] <= 4 and len(r["shape_warmup_step_s"]) <= r["timed_shapes"]
    assert r["timed_shapes"] <= r["stepped_shapes"] <= 5  # warm-up and timed steps' shapes
    assert r["cuda_graphs"] == r["cuda_graphs_eager_timed_steps"] == 0  # (no --cuda-graphs)
    assert 0 < r["achieved_flops"] <= r["achieved_flops_padded"]
    assert all(map(math.isfinite, r["loss_first_last"]))


def test_the_training_benchmark_records_host_time_the_update_and_no_datasheet_peak_on_a_cpu(
        shared_data, tmp_path):
    """Each timed step's host time (until its call returns, before the device wait) beside its
    synchronized time; one step is one update, its real target tokens beside the paper's
    8 x 3,000-token update; a datasheet peak only for a GPU the table knows."""
    from benchmarks import training

    out = tmp_path / "training.json"
    training.main(["--preset", "wmt14_en_fr", "--vocab", "1000", "--steps", "2", "--warmup", "1",
                   "--bpe-vocab", "500", "--max-tokens", "300", "--peak-sizes", "128",
                   "--data", str(shared_data), "--out", str(out)])
    r = _check_result(out, "training")["results"]
    assert all(0 < row["host_seconds"] <= row["seconds"] for row in r["per_step"])
    assert 0 < r["median_host_step_s"] <= max(row["seconds"] for row in r["per_step"])
    assert r["update"] == {"tgt_tokens_per_update": r["tgt_tokens_per_step"],
                           "max_tokens_per_update": 300,
                           "paper_update": {"gpus": 8, "max_tokens_per_gpu": 3000,
                                            "max_tokens": 24000}}
    assert r["datasheet_peak"] is r["fraction_of_datasheet_peak"] is None  # a CPU


def test_the_datasheet_peak_is_the_dense_one_of_the_gpu_torch_names():
    from benchmarks.machine import datasheet_peak

    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):  # H200 SXM, H100 SXM5
        assert datasheet_peak(name, "bf16")["flops"] == 989e12  # 1,979 with sparsity
        assert datasheet_peak(name, "fp32")["flops"] == 67e12
    assert datasheet_peak("NVIDIA H100 PCIe", "bf16")["flops"] == 756e12
    assert "datasheet" in datasheet_peak("NVIDIA H200", "bf16")["source"]
    for other in ("NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB", None):  # no guess
        assert datasheet_peak(other, "bf16") is None


def test_a_convolutions_time_counts_as_product_time():
    """The library's convolution (TrainConfig.conv = "native") runs as convolution operators
    (aten::mkldnn_convolution and aten::convolution_backward here; cuDNN's on a GPU), not as
    matmuls: the products' time holds theirs, forward and backward, and the FLOPs are rated
    over it (over the matmuls' time alone, the En-Fr model's native-conv step was rated at
    about 2.6x its products' rate, above the GPU's peak)."""
    from benchmarks.step_profile import operator_profile

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 128, (1, 5), padding=(0, 2))  # most of the FLOPs
    lin = torch.nn.Linear(128, 32)
    x = torch.randn(4, 64, 1, 32, requires_grad=True)

    def step(i):
        y = conv(x).squeeze(2).transpose(1, 2)
        lin(y).sum().backward()

    step(0)
    with FlopCounterMode(display=False) as counted:
        step(0)
    n, flops = 2, 2 * counted.get_total_flops()
    prof = operator_profile(step, n, flops)
    ms = {o["op"]: o["self_ms_per_step"] for o in prof["ops"]}
    conv_ms = sum(t for op, t in ms.items() if "convolution" in op)
    mm_ms = sum(t for op, t in ms.items() if op in ("aten::mm", "aten::addmm"))
    product_ms = prof["matmul_share"] * prof["busy_ms_per_step"]
    assert conv_ms > 0 and mm_ms > 0
    assert product_ms >= 0.999 * (conv_ms + mm_ms), (product_ms, ms)
    assert prof["matmul_flops"] == pytest.approx(flops / (n * product_ms / 1e3), rel=1e-3)
    assert {"aten::convolution_backward", "aten::mkldnn_convolution"} <= set(prof["product_ops"])
    assert "convs2s.profiled_step" not in ms  # the steps' own range is no operator


def test_an_in_place_matrix_product_counts_as_product_time():
    """The fused loss forms the output layer's weight gradient with `addmm_` (8-9% of a CPU
    step): the profile counts it with the products, as its FLOPs are (it was other work)."""
    from benchmarks.step_profile import operator_profile

    w, a, b = torch.zeros(256, 256), torch.randn(256, 512), torch.randn(512, 256)

    def step(i):
        w.addmm_(a, b)

    prof = operator_profile(step, 2, 2 * 2 * 256 * 512 * 256)
    assert "aten::addmm_" in prof["product_ops"]
    assert prof["matmul_share"] > 0.9, prof["ops"]


def test_copies_are_counted_by_the_operator_or_code_that_asked_for_them():
    """Every copy or cast is one operator, aten::copy_; the profile says who asked: autocast's
    casts of the input, weight and bias under aten::linear, their gradients cast back to
    float32 under ToCopyBackward0 (and y.float()'s), the copy of a reshaped transpose under
    aten::reshape, a cast the step's own Python code makes (no operator above it), and the
    fused loss's own casts under its custom operator (not the autograd Function torch.library
    wraps its forward in)."""
    from benchmarks.step_profile import FROM_PYTHON, operator_profile
    from convs2s.model.loss import output_layer_loss

    lin = torch.nn.Linear(64, 64)
    out = torch.nn.Linear(64, 100)
    x = torch.randn(32, 64)
    target = torch.randint(4, 100, (32,))

    def step(i):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
            loss, _ = output_layer_loss(y, out.weight, out.bias, target, 0.1,
                                        target_rows=torch.arange(32))
        z = y.float()
        (z.t().reshape(-1).sum() + loss).backward()

    step(0)
    prof = operator_profile(step, 2, 1.0)
    calls = {row["caller"]: row["calls"] for row in prof["copies_by_caller"]}
    assert calls["aten::linear"] == 3 and calls["ToCopyBackward0"] == 3
    assert calls["aten::reshape"] == 1 and calls[FROM_PYTHON] == 1
    assert calls["convs2s::output_loss"] >= 3  # h, W and b to bf16, the logits to float32
    assert not any(c.startswith("GeneratedBackwardFor_") and not c.endswith("Backward")
                   for c in calls)
    assert prof["copies_per_step"] == sum(calls.values())
    assert all(row["ms_per_step"] >= 0 for row in prof["copies_by_caller"])


def _gpu_profile(n_steps: int, sync_in_step: int) -> list:
    """The events a CUDA profile of n steps records (torch's own FunctionEvent), as the
    profiler's parse of a GPU run gives them: each step a range around two runtime launches and
    a driver launch (a Triton kernel), their three kernels, a memcpy and a memset, the range's
    annotation on the GPU, `sync_in_step` host waits inside the step; after the steps, the
    profiler's own synchronize as it exits."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from benchmarks.step_profile import STEP_RANGE

    events, ids = [], iter(range(1, 10_000))

    def ev(name, start, end, device=DeviceType.CPU, annotation=False):
        events.append(FunctionEvent(id=next(ids), name=name, thread=1, start_us=start,
                                    end_us=end, stack=[], use_device="cuda",
                                    device_type=device, is_user_annotation=annotation))

    for k in range(n_steps):
        t = 1000 * k
        ev(STEP_RANGE, t, t + 900, annotation=True)
        ev(STEP_RANGE, t + 10, t + 890, DeviceType.CUDA, annotation=True)
        ev("cudaLaunchKernel", t + 10, t + 20)
        ev("cudaLaunchKernelExC", t + 30, t + 40)
        ev("cuLaunchKernel", t + 50, t + 60)
        ev("cudaMemcpyAsync", t + 70, t + 80)
        ev("cudaMemsetAsync", t + 90, t + 95)
        for j, name in enumerate(("ampere_sgemm", "elementwise_kernel", "triton_poi_fused_0",
                                  "Memcpy HtoD (Pageable -> Device)", "Memset (Device)")):
            ev(name, t + 100 + 100 * j, t + 180 + 100 * j, DeviceType.CUDA)
        for j in range(sync_in_step):
            ev("cudaStreamSynchronize", t + 700 + 10 * j, t + 705 + 10 * j)
    ev("cudaDeviceSynchronize", 1000 * n_steps + 50, 1000 * n_steps + 60)  # profiler exit
    return events


def test_gpu_step_counts_read_each_kind_of_launch_and_only_the_steps_own_waits():
    """Launches count the driver's cuLaunchKernel (how Triton launches) with the runtime's;
    kernels leave out memcpys and memsets (counted apart) and the steps' GPU annotations; host
    waits count inside the profiled steps only: a step without one reads 0, not the
    profiler's own synchronize at its exit shared out (the 0.333 of earlier records)."""
    from benchmarks.step_profile import _launch_and_sync_counts

    quiet = _launch_and_sync_counts(_gpu_profile(3, 0), 3)
    assert quiet["host_syncs_per_step"] == 0 and quiet["host_syncs_outside_steps"] == 1
    assert quiet["profiled_steps"] == 3
    assert quiet["kernels_per_step"] == 3
    assert quiet["memcpys_per_step"] == quiet["memsets_per_step"] == 1
    assert quiet["launches_per_step"] == 3 and quiet["graph_launches_per_step"] == 0
    assert quiet["runtime_calls_per_step"]["cuLaunchKernel"] == 1
    waits = _launch_and_sync_counts(_gpu_profile(3, 2), 3)
    assert waits["host_syncs_per_step"] == 2 and waits["host_syncs_outside_steps"] == 1
    assert quiet["host_syncs_by_step"] == [0, 0, 0] and waits["host_syncs_by_step"] == [2, 2, 2]


def test_gpu_busy_time_counts_each_kernel_once_and_no_range_annotation():
    from torch.autograd.profiler_util import EventList

    from benchmarks.step_profile import _ops_and_busy_time

    events = EventList(_gpu_profile(2, 0), use_device="cuda")
    events._build_tree()
    ops, busy = _ops_and_busy_time(events.key_averages(), True, "self_device_time_total")
    assert busy == 2 * 5 * 80  # 2 steps x (3 kernels, a memcpy, a memset) x 80 us
    assert "convs2s.profiled_step" not in {e.key for e in ops}


@pytest.mark.gpu
def test_a_gpu_step_without_a_host_wait_counts_none():
    """On a GPU: a step that never waits for the device reads 0 host syncs (the profiler's own
    synchronize at its exit is outside the steps), one that reads a value back reads 1."""
    from benchmarks.step_profile import operator_profile

    a = torch.randn(512, 512, device="cuda")
    flops = 2 * 512 ** 3
    float((a @ a).sum())  # cuBLAS set up before the profiles, as a benchmark's warm-up does
    quiet = operator_profile(lambda i: (a @ a).relu_(), 3, 3 * flops)
    assert quiet["host_syncs_per_step"] == 0
    assert quiet["kernels_per_step"] >= 2 and quiet["launches_per_step"] >= 2
    waits = operator_profile(lambda i: float((a @ a).sum()), 3, 3 * flops)
    assert waits["host_syncs_per_step"] >= 1


# Stands in for python3 in scripts/gpu_checks.sh on a machine without a GPU: each benchmark
# writes its --out, and the `gpu` tests stick (pytest -m gpu, the third step), deaf to SIGTERM
# as a process blocked in a CUDA call is. Its pid is kept, for the test to end it.
_STUCK_PYTHON = """#!/usr/bin/env bash
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == --out ]] && echo '{"stand-in": true}' > "${args[i+1]}"
done
if [[ ${2:-} == pytest ]]; then
  echo $$ >> "$STUCK_PIDS"
  trap '' TERM
  exec sleep 120  # (the same pid; TERM stays ignored)
fi
exit 0
"""


def _gpu_checks_with_a_stuck_step(tmp_path, deadline: int, kill_after: int | None,
                                  step_env: dict | None = None):
    """scripts/gpu_checks.sh run with the stand-in, as scripts/gpu_lease.sh runs it (LOG and
    PACK in the folder that comes back), killed from outside after `kill_after` seconds as the
    device tool kills a call at its limit; the stand-ins left stuck are ended after.
    `step_env`: the script's KILL_AFTER / MIN_STEP, scaled down from its 10 s and 20 s."""
    import os
    import signal
    import subprocess
    import tarfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    py = tmp_path / "python"
    py.write_text(_STUCK_PYTHON)
    py.chmod(0o755)
    back, pids = tmp_path / "out", tmp_path / "stuck.pids"
    back.mkdir()
    env = {**os.environ, "PYTHON": str(py), "STUCK_PIDS": str(pids), "TMPDIR": str(tmp_path),
           "DEADLINE": str(deadline), "LOG": str(back / "gpu.log"),
           "PACK": str(back / "gpu_checks.tgz"), **(step_env or {})}
    cmd = ["bash", "scripts/gpu_checks.sh", str(tmp_path / "results"), str(tmp_path / "data")]
    if kill_after:
        cmd = ["timeout", "-s", "KILL", str(kill_after), *cmd]
    try:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        for pid in pids.read_text().split() if pids.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    with tarfile.open(back / "gpu_checks.tgz") as tar:
        packed = {Path(n).name for n in tar.getnames()}
    return done, packed, (back / "gpu.log").read_text()


def test_gpu_checks_killed_from_outside_keep_the_steps_that_ended(tmp_path):
    """A call the device tool kills while a step is stuck brings back what ended before it: the
    results are packed into the folder that comes back after every step and the log is
    written there as it goes (they sat in a scratch folder until the script returned). Issue
    37's figures come first, in its order, before anything that can stick: the 24,000-token
    step, the 3,000-token step, then CUDA graphs at 3,000 tokens."""
    done, packed, log = _gpu_checks_with_a_stuck_step(tmp_path, deadline=500, kill_after=6)
    assert done.returncode == -9 or done.returncode == 137
    assert {"training_wmt14_en_fr_cuda_bf16.json", "training_wmt14_en_fr_cuda_bf16_24k.json",
            "training_wmt14_en_fr_cuda_bf16_graphs.json"} <= packed
    assert "==== en-fr bf16 3000: exit 0" in log and "==== gpu-tests (" in log
    assert log.index("==== en-fr bf16 24000:") < log.index("==== en-fr bf16 3000:") < \
        log.index("==== en-fr bf16 3000 cuda graphs:") < log.index("==== gpu-tests (")


@pytest.mark.slow
def test_gpu_checks_kill_a_step_that_ignores_its_time_limit(tmp_path):
    """A step deaf to SIGTERM is killed KILL_AFTER s after its limit and the checks go on (here
    the deadline leaves the later steps no time: each is skipped, and the script ends). The
    script's times scaled down (a 10 s deadline, steps need 4 s, KILL 1 s after the TERM): the
    test's 40 s at the script's defaults were all waiting."""
    done, packed, log = _gpu_checks_with_a_stuck_step(
        tmp_path, deadline=10, kill_after=None, step_env={"KILL_AFTER": "1", "MIN_STEP": "4"})
    assert done.returncode == 1, log[-2000:]
    took = re.search(r"==== gpu-tests: exit 137 in (\d+) s", log)
    assert took and int(took[1]) < 10 + 1 + 2, log[-2000:]  # its limit, then KILL 1 s after
    assert "==== gpu-tests: exit 137" in log
    assert "failed steps: gpu-tests; skipped:" in log
    assert "training_wmt14_en_fr_cuda_bf16_24k.json" in packed and "gpu.log" not in packed


@pytest.mark.gpu
def test_cuda_graphs_in_the_training_benchmark_capture_every_shape_it_steps(shared_data,
                                                                             tmp_path):
    """`--cuda-graphs` captures every shape the run steps, past the graphs' default cap of 16
    (20 shapes here), so no timed step runs eagerly; the result says so."""
    from benchmarks import training

    out = tmp_path / "training.json"
    training.main(["--preset", "tiny", "--steps", "20", "--warmup", "4", "--bpe-vocab", "500",
                   "--max-tokens", "600", "--peak-sizes", "128", "--static-shapes", "8",
                   "--cuda-graphs", "--device", "cuda", "--data", str(shared_data),
                   "--out", str(out)])
    r = _check_result(out, "training")["results"]
    assert r["stepped_shapes"] > 16 and r["cuda_graphs"] == r["stepped_shapes"]
    assert r["cuda_graphs_eager_timed_steps"] == r["cuda_graphs_eager_steps"] == 0


def test_a_compile_past_its_deadline_says_where_it_was(shared_data, tmp_path):
    """`--compile-deadline`: a compile that an outer time limit would cut off silently instead
    ends itself with its timed phases and every thread's stack (exit 3)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "benchmarks.training", "--preset", "tiny", "--steps", "1",
           "--warmup", "1", "--bpe-vocab", "500", "--max-tokens", "600", "--peak-sizes", "128",
           "--compile", "aot_eager", "--compile-deadline", "0.2", "--data", str(shared_data),
           "--out", str(tmp_path / "training.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "still compiling 0 s after the start" in done.stderr
    assert "phases timed so far" in done.stderr
    assert "Thread 0x" in done.stderr  # the main thread's stack, inside the compile
    assert not (tmp_path / "training.json").exists()  # no result from a cut-off run


def test_step_traffic_counts_an_updates_operators_and_bytes(shared_data, tmp_path):
    from benchmarks import step_traffic

    out = tmp_path / "traffic.json"
    step_traffic.main(["--preset", "tiny", "--bpe-vocab", "500", "--max-tokens", "600",
                       "--dtype", "bf16", "--data", str(shared_data), "--out", str(out)])
    r = _check_result(out, "step_traffic")["results"]
    rows = r["rows"]
    assert r["ops_per_update"] == sum(x["calls"] for x in rows) > r["matmul_calls"] > 0
    # bf16 autocast casts the float32 weights: the casts are counted, and where they came from
    casts = [x for x in rows if x["op"] == "_to_copy" and x["dtypes"] == "float32->bfloat16"]
    assert casts and all(x["written"] > 0 for x in casts)
    assert any(x["where"].startswith("backward of ") for x in rows)
    assert 0 < r["cast_bytes"] < r["non_matmul_bytes"]
    assert r["non_matmul_bytes_per_tgt_token"] == pytest.approx(
        r["non_matmul_bytes"] / r["tgt_tokens"])


def test_step_traffic_counts_the_fused_loss_as_one_operator_without_computing_its_products():
    # The fused loss is a custom operator whose kernel runs its own products (6 minutes an update
    # for the En-Fr model's 40k vocabulary in bf16 on a CPU without it): under `Traffic` they
    # are zeros too. Zero logits are a uniform distribution: the nll is then n log V exactly.
    from benchmarks.step_traffic import Traffic
    from convs2s.model.loss import output_layer_loss

    torch.manual_seed(0)
    n, C, V = 7, 16, 50
    hidden = torch.randn(1, n, C, requires_grad=True)
    weight, bias = torch.randn(V, C, requires_grad=True), torch.zeros(V, requires_grad=True)
    target = torch.randint(4, V, (1, n))
    with Traffic() as traffic:
        loss, nll = output_layer_loss(hidden, weight, bias, target)
        loss.backward()
    assert nll.item() == pytest.approx(n * math.log(V), rel=1e-6)
    # float32: the loss adds each chunk's weight gradient in place (addmm_), a product skipped
    # too; the input's gradient (g W, written into place: out=) is zeros
    assert weight.grad.abs().max() == 0 and hidden.grad.abs().max() == 0
    assert bias.grad.abs().max() > 0  # (softmax - target: no product)
    ops = {op: r["calls"] for (op, _, _), r in traffic.rows.items()}
    assert ops["output_loss"] == 1
    weight.grad = hidden.grad = None
    loss, computed = output_layer_loss(hidden, weight, bias, target)  # outside: real products
    loss.backward()
    assert computed.item() != pytest.approx(n * math.log(V), rel=1e-3)
    assert weight.grad.abs().max() > 0 and hidden.grad.abs().max() > 0


def test_step_traffic_counts_the_native_convolution_as_a_product_without_the_windows_copies():
    # TrainConfig.conv = "native": the convolutions are products (not computed, zeros in the
    # kernels' channels-last layout, so no copy is counted that the real step would not make),
    # their bias gradient a column sum apart; the k-frame windows' pad, copy and shifted adds
    # are gone and nothing is copied to another layout.
    from benchmarks.step_traffic import count
    from convs2s.config import TrainConfig
    from convs2s.model.conv import use_native_conv
    from convs2s.model.network import ConvS2S
    from convs2s.train.collate import collate_lists
    from convs2s.train.optim import build_optimizer

    g = torch.Generator().manual_seed(0)
    src, tgt = ([torch.randint(4, 60, (n,), generator=g).tolist() + [EOS] for n in lengths]
                for lengths in ((9, 7, 8), (8, 9, 6)))
    counts = {}
    for conv in ("windows", "native"):
        torch.manual_seed(0)
        model = ConvS2S(PRESETS["tiny"](), 60, 60).train()
        use_native_conv(model, conv == "native")
        cfg = TrainConfig(precision="bf16", conv=conv)
        r = count(model, build_optimizer(model.parameters(), cfg), collate_lists(src, tgt), cfg,
                  torch.device("cpu"))
        counts[conv] = {(x["op"], x["where"]): x for x in r["rows"]}
    windows, native = counts["windows"], counts["native"]
    layers = len(PRESETS["tiny"]().encoder_layers) + len(PRESETS["tiny"]().decoder_layers)
    assert windows[("clone", "model/conv.py:forward")]["calls"] == layers
    assert not any("conv.py:forward" in w or "_Windows" in w for _, w in native)
    conv = native[("convolution", "model/conv.py:_native")]
    assert conv["calls"] == layers and conv["matmul"]
    assert native[("convolution_backward", "backward of ConvolutionBackward0")]["matmul"]
    bias = native[("sum", "bias of backward of ConvolutionBackward0")]
    assert bias["calls"] == layers and not bias["matmul"]
    # no copy the windows' step does not make (e.g. of a conv output in another layout)
    copies = lambda rows: {k for k in rows if k[0] in ("clone", "contiguous")}  # noqa: E731
    assert copies(native) == copies(windows) - {("clone", "model/conv.py:forward"),
                                                ("clone", "backward of _WindowsBackward")}


def test_step_traffic_counts_each_fused_region_as_one_kernel_forward_and_backward():
    # `--fuse`: the blocks' element-wise functions (convs2s.model.fused) each count as the one
    # kernel Inductor makes of them, reading inputs and writing outputs once; the eager
    # operators they replace are gone, and the step moves fewer bytes.
    from benchmarks.step_traffic import count
    from convs2s.config import TrainConfig
    from convs2s.model.fused import EAGER, REGIONS
    from convs2s.model.network import ConvS2S
    from convs2s.train.collate import collate_lists
    from convs2s.train.optim import build_optimizer

    g = torch.Generator().manual_seed(0)
    src, tgt = ([torch.randint(4, 60, (n,), generator=g).tolist() + [EOS] for n in lengths]
                for lengths in ((9, 7, 8), (8, 9, 6)))
    cfg = TrainConfig(precision="bf16")
    results = {}
    for fuse in (False, True):
        torch.manual_seed(0)
        model = ConvS2S(PRESETS["tiny"](), 60, 60).train()
        results[fuse] = count(model, build_optimizer(model.parameters(), cfg),
                              collate_lists(src, tgt), cfg, torch.device("cpu"), fuse=fuse)
        assert all(m.fused is EAGER for m in model.modules() if hasattr(m, "fused"))
    rows = {(x["op"], x["where"]): x for x in results[True]["rows"]}
    tiny = PRESETS["tiny"]()
    calls = {"glu_residual": len(tiny.encoder_layers) + tiny.attention_layers.count(False),
             **{name: sum(tiny.attention_layers) for name in REGIONS[1:]}}
    for name in REGIONS:
        for where in (name, "backward of " + name):
            assert rows[("fused", where)]["calls"] == calls[name], (where, calls)
    # an attention layer's GLU stays one eager kernel: its output feeds a product
    assert rows[("glu", "model/network.py:_conv_output")]["calls"] == sum(tiny.attention_layers)
    assert not any(op in ("_softmax", "_softmax_backward_data") for op, _ in rows)
    assert results[True]["non_matmul_bytes"] < results[False]["non_matmul_bytes"]
    assert results[True]["ops_per_update"] < results[False]["ops_per_update"]


def test_generation_benchmark_writes_result(shared_data, tmp_path):
    from benchmarks import generation

    out = tmp_path / "generation.json"
    generation.main(["--preset", "tiny", "--limit", "12", "--batch-sentences", "5",
                     "--out-len", "4", "--beams", "1", "3", "--full-prefix-limit", "6",
                     "--bpe-vocab", "500", "--peak-sizes", "128", "--data", str(shared_data),
                     "--dtype", "fp32", "int8", "--shortlist-k", "5", "--shortlist-frequent",
                     "50", "--out", str(out)])
    r = _check_result(out, "generation")["results"]
    modes = {(x["mode"], x["dtype"], x["beam"]) for x in r["runs"]}
    # int8 and vocabulary selection: timed in the same rounds as float32
    assert modes == {(m, "fp32", b) for m in ("incremental", "incremental (subset)",
                                              "full-prefix") for b in (1, 3)} | \
        {("incremental", d, b) for d in ("int8", "fp32+shortlist", "int8+shortlist")
         for b in (1, 3)}
    assert set(r["speedup_over_first_dtype"]) == {
        f"{d}/fp32 beam{b}" for d in ("int8", "fp32+shortlist", "int8+shortlist")
        for b in (1, 3)}
    sl = r["shortlist"]  # the output layer alone: the whole vocabulary against a shortlist
    assert sl["vocab"] == 1000 and 54 <= sl["shortlist_mean"] < 1000 and sl["speedup"] > 0
    for x in r["runs"]:
        assert x["mean_output_tokens"] == 5  # --out-len 4 tokens + EOS: fixed work
        assert x["extrapolated"] and x["seconds_for_6003"] > x["seconds"]
    assert set(r["speedup_incremental_vs_full_prefix"]) == {"beam1", "beam3", "beam1_best",
                                                            "beam3_best"}
    assert r["data"]["searched"] == 12 and r["data"]["batches"] == 3


def test_generation_batches_sorted_and_padded():
    from benchmarks.generation import make_batches

    src = [[5] * n + [2] for n in (4, 1, 7, 2, 3)]
    batches = make_batches(src, ref_lens=[3, 1, 6, 2, 2], limit=0, size=2, seed=1)
    assert [b[2] for b in batches] == [[1, 3], [4, 0], [2]]  # by length, then index
    tokens, lengths, _, ref_len = batches[1]
    assert lengths.tolist() == [4, 5] and tokens.shape == (2, 5)
    assert tokens[0, 4].item() == PAD and ref_len == 2  # round(mean(2, 3)) = 2 (to even)


@pytest.mark.slow
def test_preprocess_benchmark_writes_result(ray_session, tmp_path):
    from benchmarks import preprocess

    out = tmp_path / "preprocess.json"
    preprocess.main(["--sizes", "2000", "4000", "--block-rows", "1000", "--shuffle-window",
                     "1000", "--no-isolate", "--workdir", str(tmp_path / "work"),
                     "--out", str(out)])
    r = _check_result(out, "preprocess")["results"]
    ray_runs = [x for x in r["runs"] if x["mode"] == "ray"]
    plain = [x for x in r["runs"] if x["mode"] == "plain"]
    assert [x["pairs"] for x in ray_runs] == [2000, 4000] and plain[0]["pairs"] == 2000
    assert plain[0]["same_batches_as_ray"]  # the plain loop computes what the pipeline does
    assert plain[0]["rows_kept"] == ray_runs[0]["rows_kept"] > 0
    for x in r["runs"]:
        assert x["pairs_per_s"] > 0 and x["memory_mib"]["driver_rss"] > 0
    assert ray_runs[0]["memory_mib"]["workers_pss"] > 0  # the sampler sees Ray's workers
    assert r["speedup_ray_vs_plain"] > 0 and r["memory_growth_total_pss"] > 0
    stages = {"clean/train", "spm", "encoded/train", "batches/train"}
    assert set(ray_runs[0]["stage_memory_mib"]) == stages  # windows from the pipeline's log
    assert set(plain[0]["stage_memory_mib"]) == stages - {"spm"}
    assert set(r["memory_growth_by_stage_total_pss"]) == stages


def test_cost_model_marks_every_gpu_row_projected_or_measured_and_reads_the_measured_inputs(
        tmp_path):
    """The cost model runs in seconds from the recorded results; a GPU row is a measurement
    only where one GPU ran that task's paper model and budget (the H200 files), the others are
    projected, and the more GPUs, the less compute time per epoch."""
    from benchmarks import cost_model

    out = tmp_path / "cost.json"
    cost_model.main(["--out", str(out)])
    doc = _check_result(out, "cost_model")
    r = doc["results"]
    assert {t["task"] for t in r["tasks"]} == {"wmt14_en_fr", "wmt14_en_de", "wmt16_en_ro"}
    measured = [row for row in r["scales"] if row["basis"] != "projected"]
    assert {(row["task"], row["gpu"]) for row in measured} == {("wmt14_en_fr", "H200"),
                                                               ("wmt14_en_de", "H200")}
    for row in measured:  # each from the file it names (the latest lease's, by default)
        path = r["measured"]["gpu"][row["task"]]["file"]
        assert path in row["basis"]
        gpu = json.loads((RESULTS.parents[1] / path).read_text())["results"]
        # the mean step (a time to train is a sum of steps; the median leaves out slow ones)
        step_ms = 1e3 * gpu["tgt_tokens_per_step"] / gpu["tgt_tokens_per_s_overall"]
        assert step_ms > 1e3 * gpu["median_step_s"]
        assert row["basis"].startswith("measured step") and \
            row["compute_ms"] == pytest.approx(step_ms, rel=0.05)
    without = cost_model.main(["--out", str(tmp_path / "projected.json"), "--gpu-json"])
    assert all(row["basis"] == "projected" for row in without["scales"])
    for task in ("wmt14_en_fr", "wmt14_en_de", "wmt16_en_ro"):
        rows = sorted((x for x in r["scales"] if x["task"] == task and x["gpu"] == "H100"),
                      key=lambda x: x["n"])
        assert [x["n"] for x in rows] == [8, 64, 128]
        assert rows[0]["epoch_hours_linear"] > rows[1]["epoch_hours_linear"] \
            > rows[2]["epoch_hours_linear"]
    # A preset that caps its batches' sentences (En-Ro: 64) trains batches of at most that
    # many pairs, far below its token budget: the model sizes them so (it took the budget's)
    tasks = {t["task"]: t for t in r["tasks"]}
    ro = tasks["wmt16_en_ro"]
    assert ro["max_sentences"] == 64 and ro["tgt_per_batch"] == 64 * 30  # (30 tokens a pair)
    de = tasks["wmt14_en_de"]  # (its default 1,024 sentences: the 4,000 tokens decide)
    assert de["max_sentences"] * 30 > de["tgt_per_batch"] > 3000 > ro["tgt_per_batch"]
    kinds = {row["input"]: row["kind"] for row in r["inputs"]}
    assert kinds["GPU throughput"] == "projected" and kinds["preprocessing"] == "measured"
    assert kinds["GPU training, wmt14_en_fr"] == "measured"
    # bf16 gradient compression (TrainConfig.grad_compression) halves every all-reduce
    bf16 = cost_model.main(["--out", str(tmp_path / "bf16.json"), "--grad-compression", "bf16"])
    for plain, half in zip(r["scales"], bf16["scales"]):
        assert half["allreduce_ms"] == pytest.approx(plain["allreduce_ms"] / 2)
    # DDP hides the all-reduce behind the backward pass only: an update is at least the
    # forward (a third of the compute) and the all-reduce after it
    for row in r["scales"]:
        assert row["update_ms"] == pytest.approx(max(row["compute_ms"], row["compute_ms"] / 3
                                                     + row["allreduce_ms"]), rel=1e-9) \
            or row["bottleneck"].startswith("input")


def test_a_recorded_result_is_kept_unless_told_to_replace_it(tmp_path, capsys):
    from benchmarks.report import write_result

    args = ("training", {"a": 1}, {}, [0, 0, 0], [0, 0, 0], {})
    first = write_result(tmp_path / "r.json", *args, {"tok_s": 1.0})
    second = write_result(tmp_path / "r.json", *args, {"tok_s": 2.0})
    third = write_result(tmp_path / "r.json", *args, {"tok_s": 3.0})
    assert first == tmp_path / "r.json" and len({first, second, third}) == 3
    assert second.name.startswith("r-") and second.suffix == ".json"
    assert json.loads(first.read_text())["results"] == {"tok_s": 1.0}  # the recorded one
    assert json.loads(third.read_text())["results"] == {"tok_s": 3.0}
    assert "--replace overwrites it" in capsys.readouterr().err
    write_result(first, *args, {"tok_s": 4.0}, replace=True)
    assert json.loads(first.read_text())["results"] == {"tok_s": 4.0}


def test_a_benchmarks_workdir_is_emptied_only_when_that_benchmark_made_it(tmp_path):
    from benchmarks.report import fresh_workdir

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("a user's")
    with pytest.raises(SystemExit, match="holds files this benchmark did not write"):
        fresh_workdir(theirs, "train_memory")
    assert (theirs / "notes.txt").read_text() == "a user's"
    ours = fresh_workdir(tmp_path / "ours", "train_memory")
    (ours / "run.log").write_text("an earlier run's")
    assert [p.name for p in fresh_workdir(ours, "train_memory").iterdir()] == \
        [".convs2s-bench-train_memory"]


def test_the_streaming_benchmark_never_deletes_a_folder_it_did_not_create(tmp_path):
    from benchmarks.streaming import WORKDIR_MARK, _fresh_workdir

    mine = tmp_path / "work"
    _fresh_workdir(mine)  # made here
    (mine / "slice").mkdir()
    (mine / "measured.json").write_text("{}")
    _fresh_workdir(mine)  # emptied: an earlier run of this benchmark made it
    assert sorted(p.name for p in mine.iterdir()) == [WORKDIR_MARK]
    theirs = tmp_path / "home"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("precious")
    with pytest.raises(SystemExit, match="did not write"):
        _fresh_workdir(theirs)
    assert (theirs / "thesis.tex").read_text() == "precious"


def test_the_analysis_says_whether_an_effect_exceeds_the_seed_spread():
    from benchmarks.analysis import direction

    nan = float("nan")
    stats = {"baseline": {"valid_ppl": (7.0, 0.1), "bleu": (30.0, 0.2)},
             "no-pos": {"valid_ppl": (7.5, 0.2), "bleu": (29.9, 0.3)},
             "attn-1": {"valid_ppl": (6.9, nan), "bleu": (nan, nan)}}
    ppl = direction(stats, "no-pos", "valid_ppl", lower_is_better=True)
    assert ppl == {"baseline_better_by": 0.5, "seed_spread": 0.2, "beyond_spread": True}
    bleu = direction(stats, "no-pos", "bleu", lower_is_better=False)
    assert bleu["baseline_better_by"] == 0.1 and not bleu["beyond_spread"]  # within the spread
    one_seed = direction(stats, "attn-1", "valid_ppl", lower_is_better=True)
    assert one_seed["baseline_better_by"] == -0.1 and one_seed["seed_spread"] == 0.1
    assert direction(stats, "attn-1", "bleu", lower_is_better=False) is None  # no finished seed
    assert direction(stats, "no-such", "bleu", lower_is_better=False) is None


def test_the_layout_benchmark_tries_batch_sizes_budgets_and_one_actor_per_core():
    from benchmarks.generation_layout import Layout, layouts, shards

    todo = layouts(2, [64, 128], [1500])
    assert todo == [Layout(1, 2, 64), Layout(1, 2, 128), Layout(1, 2, 128, 1500),
                    Layout(2, 1, 64), Layout(2, 1, 128)]
    assert all(lay.processes * lay.threads == 2 for lay in todo)  # every core, never more
    assert [lay.processes for lay in layouts(1, [128], [])] == [1]  # no actors on one core
    lines = ["a b c d e", "a", "a b c", "a b", "a b c d"]
    parts = shards(lines, 2)
    assert sorted(i for p in parts for i in p) == list(range(5))  # every line once
    assert parts == [[0, 2, 1], [4, 3]]  # dealt in order of length: as much work each


def test_the_lenpen_benchmark_scores_each_setting_on_the_validation_set(tiny_checkpoints,
                                                                        tmp_path):
    from benchmarks import lenpen

    pairs = tiny_checkpoints["pairs"][:6]
    for side, lang in ((0, "en"), (1, "fr")):
        (tmp_path / f"val.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
    out = tmp_path / "lenpen.json"
    assert lenpen.main(["--checkpoint", str(tiny_checkpoints["a"]), "--valid", str(tmp_path),
                        "val", "en", "fr", "--lenpen", "0.5", "2.0", "--beam", "1", "2",
                        "--max-len-b", "6", "--out", str(out)]) == 0
    r = _check_result(out, "lenpen")["results"]
    assert {(x["beam"], x["lenpen"]) for x in r["rows"]} == {(1, 0.5), (1, 2.0), (2, 0.5),
                                                             (2, 2.0)}
    assert r["best"] == r["rows"][0] and r["best"]["bleu"] == max(x["bleu"] for x in r["rows"])
    assert all(x["length_ratio"] > 0 for x in r["rows"])


def test_the_preprocess_benchmark_removes_only_the_folders_it_made(tmp_path):
    """--workdir may hold other files: a corpus-N / ray-N / plain-N folder without the
    benchmark's owner mark is refused, never removed."""
    from benchmarks.preprocess import OWNER_MARK, fresh_dir, remove_own

    theirs = tmp_path / "ray-2000"
    theirs.mkdir()
    (theirs / "results.txt").write_text("someone's")
    with pytest.raises(SystemExit, match="was not made by this benchmark"):
        fresh_dir(theirs)
    assert (theirs / "results.txt").read_text() == "someone's"
    ours = fresh_dir(tmp_path / "plain-2000")
    assert (ours / OWNER_MARK).is_file()
    (ours / "part-0.parquet").write_bytes(b"x")
    assert fresh_dir(ours) == ours and [p.name for p in ours.iterdir()] == [OWNER_MARK]
    remove_own(ours)
    assert not ours.exists()


def test_the_suite_profile_records_each_phase_and_sums_them_per_file():
    """benchmarks.suite_phases: the plugin writes one line a test phase, with the machine's busy
    and idle CPU seconds over it; the summary adds them per file and lists the slowest first."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from benchmarks.suite_phases import summarize

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "test_two.py").write_text(
            "import time\n"
            "def test_busy():\n    t = time.process_time()\n"
            "    while time.process_time() - t < 0.3: pass\n"
            "def test_sleeps():\n    time.sleep(0.3)\n"
            "    from benchmarks.suite_phases import span\n"
            "    with span('aside'):\n        time.sleep(0.1)\n")
        out = Path(d) / "phases.jsonl"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "benchmarks.suite_phases", "test_two.py"], cwd=d,
                              env={**os.environ, "SUITE_PHASES_OUT": str(out),
                                   "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    (aside,) = [r for r in rows if "background" in r]  # a stretch that is not a test phase
    rows.remove(aside)
    assert [(r["id"].split("::")[1], r["phase"]) for r in rows] == [
        (t, p) for t in ("test_busy", "test_sleeps") for p in ("setup", "call", "teardown")]
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)  # when each began
    assert rows[4]["t"] < aside["t"] < rows[5]["t"] and aside["wall"] >= 0.1
    calls = {r["id"].split("::")[1]: r for r in rows if r["phase"] == "call"}
    assert calls["test_busy"]["busy"] >= 0.25 and calls["test_sleeps"]["wall"] >= 0.3
    res = summarize([*rows, aside], top=1)
    assert res["tests"] == 2 and len(res["slowest_phases"]) == 1
    assert [b["name"] for b in res["background"]] == ["aside"]
    assert res["slowest_phases"][0]["name"].startswith("call test_two.py::")
    (per_file,) = res["per_file"]
    assert per_file["name"] == "test_two.py"
    assert per_file["wall_s"] == pytest.approx(sum(r["wall"] for r in rows), abs=0.1)


def test_the_process_profile_gives_each_kind_of_process_its_cpu(tmp_path):
    """benchmarks.process_cpu: a command's CPU, by the kind of process that used it (a child
    that burns 0.6 s is counted under its own command line; a sleeping one costs nothing), and
    Ray's processes named by their titles."""
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.process_cpu import kind

    (tmp_path / "burner.py").write_text(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
        "time.sleep(0.5)\n")  # read again, idle, before it ends
    # (the parent waits for it: however long the burn takes on a busy machine, it is sampled)
    burn = ("import subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, {str(tmp_path / 'burner.py')!r}])\n"
            "c.wait()\n")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.process_cpu", "--interval", "0.05",
                           "--out", str(out), "--", sys.executable, "-c", burn],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())["results"]
    kinds = {k["kind"]: k for k in res["kinds"]}
    burner = [k for name, k in kinds.items() if "burner" in name]
    assert len(burner) == 1 and 0.5 <= burner[0]["cpu_s"] <= 1.0, res["kinds"]
    assert res["wall_s"] >= 1.0 and res["cpu_s"] >= burner[0]["cpu_s"]  # burn + sleep
    assert kind("ray::RayTrainWorker.__init__ ") == "ray::RayTrainWorker.__init__"
    assert kind("/x/bin/python -u /x/ray/_private/log_monitor.py --x") == "ray daemon: log monitor"
    assert kind("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=a") == \
        "ray daemon: raylet"


def test_training_benchmark_refuses_cuda_graphs_without_static_shapes_or_a_gpu_and_two_compiles(
        capsys):
    from benchmarks import training

    for argv, says in ((["--cuda-graphs", "--device", "cuda"], "--static-shapes"),
                       (["--cuda-graphs", "--static-shapes", "16"], "CUDA --device"),
                       (["--compile-mode", "reduce-overhead"], "needs --compile"),
                       (["--fuse", "inductor", "--compile", "inductor"], "give one of them")):
        with pytest.raises(SystemExit):
            training.parse_args(argv)
        assert says in capsys.readouterr().err


def test_static_shapes_benchmark_writes_result(shared_data, tmp_path):
    from benchmarks import static_shapes

    out = tmp_path / "static_shapes.json"
    static_shapes.main(["--max-tokens", "600", "--multiples", "8", "32", "--bpe-vocab", "500",
                        "--data", str(shared_data), "--out", str(out)])
    rows = _check_result(out, "static_shapes")["results"]["rows"]
    assert [r["multiple"] for r in rows] == [8, 32]
    for r in rows:
        assert 1 <= r["shapes_first_35"] <= r["shapes"] <= r["batches"]
        assert r["padding_factor"] >= 1.0 and 0 < r["real_tokens_per_slot_unpadded"] <= 1
    assert rows[1]["shapes"] <= rows[0]["shapes"]  # coarser rounding: fewer shapes


def test_server_ports_come_from_outside_the_ranges_other_processes_draw_from():
    """A test server's port is held only once the server binds it, seconds later; a port from
    the kernel's ephemeral range (or Ray's worker ports) can be taken by another process in
    between (CI: a gRPC server answered a test head's dashboard-agent health check)."""
    import itertools
    import random
    import socket

    from workflows import cluster
    from workflows.cluster import RAY_WORKER_PORTS, ephemeral_range, free_port

    ephemeral = ephemeral_range()
    if ephemeral.start - RAY_WORKER_PORTS.stop < 1000:
        pytest.skip("no room between Ray's worker ports and this kernel's ephemeral range: "
                    "free_port falls back to a kernel-picked port")
    ports = [free_port(random.Random(seed)) for seed in (1, 1, 2)]  # one seed twice
    assert len(set(ports)) == 3 and set(ports) <= cluster._HANDED_OUT  # never one port twice
    for port in ports:
        assert port not in ephemeral and port not in RAY_WORKER_PORTS
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out
    # Two ports nobody was given yet, the first held by a listening socket: never handed out.
    held_port, other = itertools.islice(
        (p for p in range(RAY_WORKER_PORTS.stop, ephemeral.start)
         if p not in cluster._HANDED_OUT and cluster._bindable(p)), 2)
    with socket.socket() as held:
        held.bind(("", held_port))
        held.listen()
        picks = iter([held_port, other])

        class Picks(random.Random):
            def randrange(self, *_):
                return next(picks)

        assert free_port(Picks()) == other


def test_a_test_clusters_agent_port_held_by_another_kind_of_server_is_one_clear_error(tmp_path):
    """What CI once met: the port given to a test head's dashboard agent answered with HTTP/2
    bytes (another process's gRPC server). The health check says so at once, naming the port
    (and `start_head` starts the head once more on new ports), instead of a raw BadStatusLine."""
    import socket
    import threading

    from benchmarks.local_cluster import RayCliCluster, cli_env

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        def answer():  # an HTTP/2 SETTINGS frame, as a gRPC server sends first
            conn, _ = srv.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x7f\xff\xff\xff\n")

        threading.Thread(target=answer, daemon=True).start()
        cluster = RayCliCluster(cli_env(), temp_dir=str(tmp_path))  # starts nothing
        with pytest.raises(RuntimeError, match=f"port {port}, given to the dashboard agent, "
                                               "answers as another kind of server"):
            cluster.wait_for_agent(port, timeout=10)


def test_the_train_startup_benchmark_reads_the_controllers_phases_and_leaves_cold_runs_out():
    from benchmarks.train_startup import controller_phases, summarize

    log = "\n".join([  # Ray Train 2.60's controller log, two runs' worker group starts
        '{"message": "[Worker Group Initialization] 2 worker actors created in 5.80s."}',
        '{"message": "[Worker Group Initialization] 2 worker actors created in 2.79s."}',
        '{"message": "[Worker Group Initialization] Train context initialized on workers in '
        '2.70s."}'])
    assert controller_phases(log) == {"actors_created_s": 2.79, "context_init_s": 2.7,
                                      "group_start_s": None}
    rows = [{"variant": "a", "run": r, "total_s": t, "start_to_entry_s": t - 1,
             "actors_created_s": None, "context_init_s": 1.0, "entry_to_end_s": 1.0,
             "busy_core_s": 2 * t}
            for r, t in ((0, 30.0), (1, 8.0), (2, 10.0), (1, 9.0))]
    (a,) = summarize(rows, ["a"])
    assert a["total_s"] == 9.0 and a["start_to_entry_s"] == 8.0  # the cold 30 s left out
    assert a["busy_core_s"] == 18.0
    assert a["actors_created_s"] is None and a["context_init_s"] == 1.0


def test_a_result_written_without_git_names_the_commit_its_copier_recorded(tmp_path,
                                                                          monkeypatch):
    """On the lent GPU machine the tree has no .git: a result named commit "" and a clean tree.
    It names the commit `scripts/gpu_lease.sh prepare` recorded (CONVS2S_COMMIT), or none."""
    from benchmarks import machine

    monkeypatch.setattr(machine, "REPO", tmp_path)  # a folder outside any git repository
    monkeypatch.delenv("CONVS2S_COMMIT", raising=False)
    assert machine._git_commit() == {"commit": None, "dirty": None}
    monkeypatch.setenv("CONVS2S_COMMIT", "0123abc The subject with changes not committed ")
    assert machine._git_commit() == {
        "commit": "0123abc", "dirty": None,
        "recorded": "0123abc The subject with changes not committed"}
    monkeypatch.setattr(machine, "REPO", machine.Path(__file__).resolve().parents[1])
    assert len(machine._git_commit()["commit"]) == 40  # this checkout: git's own answer
