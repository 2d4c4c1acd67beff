"""The precision modes, in one table (`MODES`), and which one training computes in: bf16
autocast or float32, chosen once per run and the same on every rank.

    mode  training (TrainConfig.precision)  inference (SearchConfig.precision)  devices
    fp32  float32, no autocast              float32 weights, as trained         CPU, GPU
    bf16  bf16 autocast; float32 master     bf16 weights and activations        CPU, GPU
          weights and optimizer state                                           (inference: a
                                                                                GPU with native
                                                                                bf16 only)
    int8  (not a training mode)             int8 weights per output channel,    CPU only
                                            8-bit dynamic activations

`auto` (training only) is bf16 where every rank multiplies bf16 natively, else fp32. The
training side reads the table here (`Precision.autocast`, `CHOICES`); the inference side in
`convs2s.inference.quantize` (`unavailable`, `for_inference`) and `convs2s.config`
(`INFERENCE_PRECISIONS`); every command line's `--precision` offers the table's names.

bf16 autocast runs the matrix products (convolutions as GEMMs, attention projections, the output
layer) in bf16 and keeps float32 where numerics need it: the master weights and the optimizer state
(parameters stay float32), weight-norm statistics (computed on the float32 parameters), the
attention softmax and the loss's log-softmax (`convs2s.model.network`, `convs2s.model.loss`). It
pays only where the hardware multiplies bf16 natively: GPUs from Ampere on, and CPUs with AVX-512
BF16 or AMX (measured on an AMD EPYC (Zen 4) host: bf16 GEMMs 2.2x the float32 rate, the
`iwslt_de_en` training step 1.65-1.75x). Elsewhere torch emulates bf16 and is slower than float32,
so `auto` picks float32 there.

    precision = local_precision("auto", device)          # this process: Precision(name, reason)
    precision = world_precision("auto", device, comm)     # a training world: the same on every rank
    with precision.autocast(device): loss = model(...)

`CONVS2S_CPU_BF16=1|0` overrides the CPU detector (tests; a host whose flags lie).
Imports only the standard library, and torch where a mode is applied (`dtype`, `autocast`) or a
GPU is asked about: a command decides a CPU run's precision before torch loads
(`local_precision("auto", "cpu")`), so that a refused command answers at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch



@dataclass(frozen=True)
class Mode:
    """One row of the precision table: what a mode means to training and to inference, and the
    devices it runs on (the device rule; whether it runs there at full speed is `native_bf16`)."""

    name: str
    autocast: str | None  # training: the dtype the forward passes autocast to; None: float32
    trains: bool  # a training precision (TrainConfig.precision), not only an inference one
    weights: str  # inference: what the inference copy's weights become
    # device types an inference copy in this mode is limited to; None: any torch runs on
    devices: tuple[str, ...] | None
    gpu_needs_native: bool  # inference on a GPU needs native bf16 (compute capability >= 8.0)


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("fp32", autocast=None, trains=True, weights="float32", devices=None,
         gpu_needs_native=False),
    Mode("bf16", autocast="bfloat16", trains=True, weights="bfloat16", devices=None,
         gpu_needs_native=True),
    Mode("int8", autocast=None, trains=False, weights="int8", devices=("cpu",),
         gpu_needs_native=False),
)}
# TrainConfig.precision: a training mode, or `auto` (decided per run: `common_precision`).
CHOICES = ("auto",) + tuple(name for name, mode in MODES.items() if mode.trains)
# SearchConfig.precision: every mode converts an inference copy (convs2s.inference.quantize).
INFERENCE_PRECISIONS = tuple(MODES)
OVERRIDE_ENV = "CONVS2S_CPU_BF16"
# CPU flags of native bf16 matrix products: x86 AVX-512 BF16 / AMX (/proc/cpuinfo "flags"),
# Arm BF16 (aarch64 "Features").
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ARM_BF16_FLAGS = ("bf16",)


@dataclass(frozen=True)
class Precision:
    """A run's training precision: `name` ("bf16" or "fp32") and why it was picked."""

    name: str
    reason: str

    def __post_init__(self) -> None:
        if self.name not in MODES or not MODES[self.name].trains:
            raise ValueError(f"training precision {self.name!r}: choose one of "
                             f"{', '.join(CHOICES[1:])} (or auto, decided per run)")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the forward passes compute the matrix products in."""
        import torch

        return getattr(torch, MODES[self.name].autocast or "float32")

    def autocast(self, device: torch.device):
        """The context the forward passes run in: the mode's autocast, or nothing (float32)."""
        to = MODES[self.name].autocast
        if to is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device.type, dtype=getattr(torch, to))


@functools.lru_cache(maxsize=4)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags (Linux), None where they cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_native_bf16(flags: frozenset[str] | set[str] | None = None) -> tuple[bool, str]:
    """(whether this CPU multiplies bf16 natively, the evidence). `flags` defaults to this
    host's; the environment override `CONVS2S_CPU_BF16` wins over both."""
    forced = os.environ.get(OVERRIDE_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1", f"{OVERRIDE_ENV}={forced}"
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return False, f"CPU flags unreadable on {platform.system() or 'this OS'}"
    found = [f for f in X86_BF16_FLAGS + ARM_BF16_FLAGS if f in flags]
    if found:
        return True, "CPU flags " + ", ".join(found)
    return False, "no avx512_bf16 / amx_bf16 CPU flag"


def native_bf16(device: torch.device | str) -> tuple[bool, str]:
    """(whether `device` (a torch.device, or its type: "cpu", "cuda") multiplies bf16
    natively, the evidence)."""
    kind = getattr(device, "type", device)
    if kind == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        return major >= 8, f"{torch.cuda.get_device_name(device)} (compute {major}.{minor}" \
            f"{'' if major >= 8 else ', bf16 native from 8.0'})"
    if kind == "cpu":
        return cpu_native_bf16()
    return False, f"device {kind}: bf16 support unknown"


def runs_on_gpus(name: str) -> bool:
    """Whether an inference copy in mode `name` searches on a GPU (int8: on the CPU, PyTorch's
    quantized kernels, even where a GPU is visible or reserved). A name outside the table: True,
    for `SearchConfig` to refuse with the choices."""
    mode = MODES.get(name)
    return mode is None or mode.devices is None or "cuda" in mode.devices


def inference_unavailable(name: str, device: torch.device | str) -> str | None:
    """Why an inference copy in mode `name` cannot run on `device` (a torch.device or its type),
    by the table's device rule; None where it can. (Whether this build has the mode's kernels,
    int8's quantized engine, is `convs2s.inference.quantize.unavailable`'s probe.) bf16 on a CPU
    without it runs, emulated and slow; a GPU before Ampere is refused (torch's
    `is_bf16_supported` says yes to its emulation)."""
    mode = MODES[name]
    kind = getattr(device, "type", device)
    if mode.devices is not None and kind not in mode.devices:
        where = " and ".join({"cpu": "CPUs", "cuda": "GPUs"}.get(d, d) for d in mode.devices)
        other = [n for n, m in MODES.items() if n != name and m.autocast
                 and (m.devices is None or kind in m.devices)]
        return (f"{name} inference runs on {where}, not on {device}"
                + (f": use precision {other[0]} there" if other else ""))
    if kind == "cuda" and mode.gpu_needs_native:
        native, evidence = native_bf16(device)
        if not native:
            return f"this GPU ({evidence}) has no native {name}: use precision fp32"
    return None


def local_precision(requested: str, device: torch.device | str) -> Precision:
    """This process's precision for `requested` ("auto", "bf16" or "fp32") on `device`."""
    return common_precision(requested, [(socket.gethostname(), *native_bf16(device))])


def common_precision(requested: str, nodes: list[tuple[str, bool, str]]) -> Precision:
    """One precision for a world whose ranks report (host, native bf16, evidence): `auto` is
    bf16 only when every rank has native bf16 (a mixed cluster trains float32 everywhere
    rather than mixing precisions), `bf16` / `fp32` are taken as asked."""
    if requested not in CHOICES:
        raise ValueError(f"precision {requested!r}: choose one of {', '.join(CHOICES)}")
    hosts: dict[str, tuple[bool, str]] = {}
    for host, ok, why in nodes:  # one entry per host: native only if all its ranks are
        if host in hosts:
            seen_ok, seen_why = hosts[host]
            ok, why = seen_ok and ok, seen_why if why == seen_why else f"{seen_why}, {why}"
        hosts[host] = (ok, why)
    lacking = sorted(h for h, (ok, _) in hosts.items() if not ok)
    evidence = "; ".join(f"{h}: {why}" for h, (_, why) in sorted(hosts.items()))
    if requested == "fp32":
        return Precision("fp32", "asked for (precision=fp32)")
    if requested == "bf16":
        slow = f"; emulated, slower than float32, on {', '.join(lacking)}" if lacking else ""
        return Precision("bf16", f"asked for (precision=bf16){slow}")
    if not lacking:
        return Precision("bf16", f"auto: native bf16 matrix products ({evidence})")
    if len(hosts) > 1 and len(lacking) < len(hosts):
        return Precision("fp32", f"auto: float32 on every node, {', '.join(lacking)} lacks "
                                 f"native bf16 ({evidence})")
    return Precision("fp32", f"auto: no native bf16 ({evidence})")


def world_precision(requested: str, device: torch.device, comm) -> Precision:
    """The precision of a training world, the same on every rank: each rank reports its host's
    support (`comm.gather_objects`, a collective), every rank decides on the same list."""
    mine = (socket.gethostname(), *native_bf16(device))
    return common_precision(requested, comm.gather_objects(mine))
