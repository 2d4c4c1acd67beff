"""The machine a benchmark runs on: description, load, and its measured matmul peak.

Every benchmark records `machine_info()` and the load average before and after it runs, and
compares its achieved FLOP/s with `matmul_peak()` measured in the same process, with the same
thread count and dtype (float32, or bf16 where the hardware has it natively): the fraction of
the machine's own peak is comparable across machines, raw throughput is not.

    from benchmarks.machine import machine_info, matmul_peak, wait_for_quiet
    waited = wait_for_quiet(max_load=1.5, timeout_s=600)   # poll the 1-minute load average
    peak = matmul_peak(torch.device("cpu"), torch.float32)  # {"flops": ..., "by_size": ...}

Run `python -m benchmarks.machine` to print both.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

# torch is imported where it is used: the preprocessing benchmark's driver stays torch-free, so
# the memory it reports is the pipeline's own.

REPO = Path(__file__).resolve().parents[1]


def load_average() -> list[float]:
    """1-, 5- and 15-minute load averages (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_seconds() -> tuple[float, float]:
    """(all, idle) CPU seconds of the machine since boot, every core (/proc/stat's first line;
    idle counts iowait): their differences over a stretch give its busy and idle core s."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return sum(ticks) / hz, (ticks[3] + ticks[4]) / hz


def wait_for_quiet(max_load: float, timeout_s: float, poll_s: float = 15.0) -> dict:
    """Sleep until the 1-minute load average is below `max_load` or `timeout_s` has passed.

    Timings taken while other processes compete for the cores measure the neighbours, not the
    code; the result says whether the machine got quiet so a reader can discount the figures.
    """
    t0 = time.monotonic()
    while True:
        load = load_average()
        quiet = bool(load) and load[0] < max_load
        if quiet or time.monotonic() - t0 >= timeout_s:
            return {"quiet": quiet, "max_load": max_load, "waited_s": round(time.monotonic() - t0),
                    "load_at_start": load}
        print(f"waiting for a quiet machine: load average {load} (want < {max_load})",
              file=sys.stderr, flush=True)
        time.sleep(poll_s)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git_commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        if commit:
            return {"commit": commit,
                    "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        pass
    # A copy of the tree without its .git (the lent GPU machine): the commit its copier
    # recorded (scripts/gpu_lease.sh: `git log -1` and whether the tree had changes), or none
    # known; not "" and clean, which a result would have claimed.
    recorded = os.environ.get("CONVS2S_COMMIT", "").strip()
    return {"commit": recorded.split()[0] if recorded else None, "dirty": None,
            **({"recorded": recorded} if recorded else {})}


def machine_info(device=None) -> dict:
    """What ran the benchmark: CPU, cores, memory, GPU, library versions, git commit; torch
    threads and version when a torch device is given."""
    import numpy

    info = {
        "hostname": platform.node(), "platform": platform.platform(), "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(), "memory_gib": _memory_gib(), "device": str(device or "cpu"),
        "versions": {"python": platform.python_version(), "numpy": numpy.__version__},
        "git": _git_commit(),
        "cpu_flags": _cpu_matmul_flags(),
    }
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) != os.cpu_count():
        info["cpus_usable"] = len(os.sched_getaffinity(0))  # pinned (taskset) to fewer
    limits = {k: os.environ[k] for k in ISA_LIMITS if os.environ.get(k)}
    if limits:  # a host made to run as one without its wider instructions (or without bf16)
        info["isa_limits"] = limits
    if device is None:
        return _imported_versions(info)
    import torch

    info["torch_threads"] = torch.get_num_threads()
    info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["versions"]["torch"] = torch.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "multiprocessors": props.multi_processor_count,
                       "cuda": torch.version.cuda}
    return _imported_versions(info)


# The CPU features that decide the matmul rates: AVX-512, native bf16 (AVX-512 BF16, AMX) and
# int8 dot products (VNNI); a figure is comparable only between hosts that share them.
MATMUL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                "amx_int8", "amx_tile", "bf16", "i8mm", "asimddp")


# Environment settings that cap what the kernels use below what the flags say: ATen's vector
# kernels (ATEN_CPU_CAPABILITY=avx2), oneDNN's matmuls and convolutions (ONEDNN_MAX_CPU_ISA=AVX2),
# MKL's (MKL_ENABLE_INSTRUCTIONS=AVX2) and the project's native-bf16 decision
# (CONVS2S_CPU_BF16=0, convs2s/precision.py). Set together, they run an AVX-512 / AMX host as a
# host without them (docs/benchmarks.md).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
              "CONVS2S_CPU_BF16")


def _cpu_matmul_flags() -> list[str] | None:
    from convs2s.precision import cpu_flags

    flags = cpu_flags()
    return None if flags is None else [f for f in MATMUL_FLAGS if f in flags]


def _imported_versions(info: dict) -> dict:
    for name in ("sentencepiece", "ray", "pyarrow", "psutil", "sacrebleu"):
        mod = sys.modules.get(name)  # only what the benchmark imported: no slow imports here
        if mod is not None:
            info["versions"][name] = getattr(mod, "__version__", "?")
    return info


def synchronize(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def time_call(fn, device, repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of `repeats` calls of fn() after `warmup` calls (device synced)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def matmul_rate(m: int, k: int, n: int, device, dtype, repeats: int = 10) -> dict:
    """FLOP/s of an (m x k) @ (k x n) product, 2mkn over the median and over the fastest of
    `repeats` timings (the fastest is the better estimate of capability on a busy machine).

    Random inputs (zeros run faster on some hardware), output buffer reused so allocation is
    not timed.
    """
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    times = time_call(lambda: torch.matmul(a, b, out=out), device, repeats, warmup=2)
    return {"median": 2.0 * m * k * n / median(times), "best": 2.0 * m * k * n / min(times)}


def matmul_peak(device, dtype, sizes: tuple[int, ...] | None = None, repeats: int = 10) -> dict:
    """The machine's matmul peak: the best FLOP/s of square products over a few sizes
    (`flops` from median timings, `flops_best` from the fastest ones).

    Sizes default to the model-scale 1024 and 2048 on CPU and 4096 / 8192 on GPU (large enough
    to reach the tensor cores' peak).
    """
    import torch

    if sizes is None:
        sizes = (1024, 2048) if device.type == "cpu" else (4096, 8192)
    by_size = {str(n): matmul_rate(n, n, n, device, dtype, repeats) for n in sizes}
    return {"flops": max(r["median"] for r in by_size.values()),
            "flops_best": max(r["best"] for r in by_size.values()),
            "by_size": by_size, "dtype": str(dtype).split(".")[-1],
            "threads": torch.get_num_threads(), "repeats": repeats}


# The GPUs' datasheet peaks, dense (without 2:4 structured sparsity), in FLOP/s: NVIDIA's H100
# and H200 datasheets give bf16 tensor-core rates with sparsity, twice these (H100 SXM and H200
# SXM 1,979 TFLOPS: 989 dense; H100 PCIe 1,513: 756), and float32 on the CUDA cores (67; PCIe 51).
# Matched on torch's device name (the H100 SXM calls itself "H100 80GB HBM3"); the NVL boards run
# at lower clocks and are not listed: a GPU not here gets no datasheet figure, not a guess.
DATASHEET_PEAKS = (  # (names containing, bf16, float32)
    (("H200",), 989e12, 67e12),
    (("H100 80GB HBM3", "H100 SXM"), 989e12, 67e12),
    (("H100 PCIe",), 756e12, 51e12),
)


def datasheet_peak(gpu: str | None, dtype: str) -> dict | None:
    """The datasheet's dense peak for `dtype` ("bf16" or "fp32") of the GPU torch names `gpu`
    (torch.cuda.get_device_name), to set beside the peak measured in the same process:
    {"gpu", "dtype", "flops", "source"}; None for no GPU or one the table does not hold."""
    for marks, bf16, fp32 in DATASHEET_PEAKS:
        if gpu and "NVL" not in gpu and any(m in gpu for m in marks):
            return {"gpu": gpu, "dtype": dtype, "flops": bf16 if dtype == "bf16" else fp32,
                    "source": "NVIDIA H100 / H200 datasheet, dense (half the sparsity figure)"
                    if dtype == "bf16" else "NVIDIA H100 / H200 datasheet, FP32 (no tensor cores)"}
    return None


def main() -> None:
    import argparse

    import torch

    p = argparse.ArgumentParser(description="Print this machine's description and matmul peak.")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(json.dumps({"machine": machine_info(device), "load": load_average(),
                      "peak": matmul_peak(device, dtype)}, indent=2))


if __name__ == "__main__":
    main()
