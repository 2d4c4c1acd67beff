"""Inference precision: an inference copy of a model in float32, bf16 or int8 weights.

    net = for_inference(inference_copy(model), "int8")  # what load_for_inference does
    net.precision  # "int8": what it serves, for logs, MLflow and the search

- **fp32**: the weights as trained (weight norm folded in).
- **bf16**: weights and activations in bf16; the attention softmax (`convs2s.model.network`) and the
  search's log-softmax stay float32. Fast where the hardware multiplies bf16 natively (GPUs,
  CPUs with AVX-512 BF16 or AMX); emulated and slow elsewhere.
- **int8**: every matrix product of the encoder and the decoder (the convolutions, both in the
  full pass and in the incremental step, the attention projections, fc1 / fc2 and the output
  projection fc3) with int8 weights, one scale per output channel (symmetric), and activations
  quantized per call (dynamic quantization: one scale over all the rows of the call, every
  sentence and beam of a batch, so that an int8 result depends a little on its batch; PyTorch's
  kernels take one activation scale), accumulating in int32 and returning float32:
  PyTorch's quantized linear kernels (oneDNN where the CPU has int8 dot products, AVX-512 VNNI /
  AMX; x86 / fbgemm elsewhere, with 7-bit weights: `weight_levels`). Embeddings, the softmaxes
  and the beam bookkeeping stay float32; with vocabulary selection, a batch's rows of fc3 are
  packed into an int8 layer of their own once per batch (`Int8Linear.select`).

Nothing changes unless asked: `SearchConfig.precision` is "fp32" by default. An int8 request
where PyTorch has no quantized CPU kernels is an error that says so (`PrecisionError`), or, when
the user asked for it (`SearchConfig.precision_fallback="fp32"`), one warning and float32
weights (`resolve_precision`). Imports only torch.
"""

from __future__ import annotations

import logging
import threading
import warnings

import torch
import torch.nn as nn

from convs2s.precision import INFERENCE_PRECISIONS, MODES, inference_unavailable

log = logging.getLogger("convs2s.inference.quantize")


class PrecisionError(RuntimeError):
    """An inference precision this machine or build cannot serve."""


VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products without saturation


def has_int8_dot_products() -> bool:
    """Whether this CPU multiplies u8 x s8 into int32 without saturating (VNNI / AMX)."""
    from convs2s.precision import cpu_flags

    flags = cpu_flags()
    if flags is not None:
        return any(f in flags for f in VNNI_FLAGS)
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(probe and probe())


def int8_engine() -> str:
    """The quantized engine for int8 weights: oneDNN where the CPU has int8 dot products (VNNI /
    AMX: the fastest measured), else x86 / fbgemm; PrecisionError without any."""
    engines = _supported_engines()
    order = ("onednn", "x86", "fbgemm") if has_int8_dot_products() else \
        ("x86", "fbgemm", "qnnpack", "onednn")
    for name in order:
        if name in engines:
            return name
    raise PrecisionError(
        f"int8 inference needs PyTorch's quantized CPU kernels (oneDNN or fbgemm); this build "
        f"has {engines or 'none'}: use precision fp32 (or bf16), or a standard x86-64 / "
        "aarch64 PyTorch wheel")


def _supported_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def weight_levels() -> int:
    """The largest int8 weight magnitude: 127 where the CPU has int8 dot products and the
    engine is oneDNN, which uses them; else 63 (fbgemm, the x86 engine's kernels, may take the
    AVX2 path on a CPU whose VNNI it has no kernels for, e.g. AVX-VNNI without AVX-512).

    Without VNNI / AMX the kernels multiply u8 activations by s8 weights in pairs summed into
    16 bits (AVX2 / AVX-512 `vpmaddubsw`), which saturates past 32,767: 255 x 127 x 2 does,
    255 x 63 x 2 = 32,130 does not. PyTorch's own rule keeps the weights and drops a bit of the
    activations instead (`reduce_range`); on the trained demo model that moved 15 of 60 beam-5
    translations (an AVX2 kernel run, docs/benchmarks.md "int8 without VNNI"), while 7-bit
    weights, one scale per output channel, keep the 8-bit activations' per-call scale over the
    whole batch and translate like the VNNI path."""
    return 127 if has_int8_dot_products() and int8_engine() == "onednn" else 63


_PACKING = threading.Lock()


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored in int8 (per-output-channel scales) and x quantized per call;
    float32 in and out. Built from a float weight (out x in) and bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        engine = int8_engine()
        w = weight.detach().float().contiguous()
        self.out_features, self.in_features = w.shape
        self.levels = weight_levels()  # no saturating 16-bit sums on any CPU (see there)
        scale = (w.abs().amax(dim=1) / self.levels).clamp(min=1e-8).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        b = None if bias is None else bias.detach().float().contiguous()
        # The engine is process-wide: one packing at a time (a server's threads each select a
        # batch's rows), or one thread's restore could leave another's engine in place.
        with _PACKING:
            saved = torch.backends.quantized.engine
            try:
                torch.backends.quantized.engine = engine  # the packing picks the kernel
                with warnings.catch_warnings():  # torch >= 2.10: quantized tensors deprecated
                    warnings.simplefilter("ignore", UserWarning)
                    qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
                    self._packed = torch.ops.quantized.linear_prepack(qw, b)
            except (RuntimeError, AttributeError) as err:
                raise PrecisionError(f"int8 weights could not be packed with the {engine} "
                                     f"engine ({err}): use precision fp32 or bf16") from None
            finally:
                torch.backends.quantized.engine = saved
        self.engine = engine
        # The float weights stay readable (not parameters): vocabulary selection multiplies a
        # batch's few rows of fc3 in float (`ConvS2S.output_rows`).
        self.weight, self.bias = w, b if b is not None else torch.zeros(w.shape[0])

    def select(self, rows: torch.Tensor) -> "Int8Linear":
        """The layer of output rows `rows` only (vocabulary selection's fc3 for one batch):
        re-quantized from the float rows, so each row keeps its own scale."""
        return Int8Linear(self.weight.index_select(0, rows), self.bias.index_select(0, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out), float32
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float().contiguous(),
                                               self._packed, False)  # 8-bit activations
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, int8 ({self.engine}, weights within "
                f"+-{self.levels})")


def unavailable(precision: str, device: str | torch.device = "cpu") -> str | None:
    """Why `precision` cannot be served on `device` here, or None where it can: int8 needs the
    CPU and a quantized engine that packs a weight (probed once, on a 2 x 2 matrix); bf16 on a
    GPU needs one that multiplies bf16. (bf16 on any CPU runs, emulated and slow without
    AVX-512 BF16 / AMX.)"""
    device = torch.device(device)
    why = inference_unavailable(precision, device)  # the precision table's device rule
    if why is None and MODES[precision].weights == "int8":
        try:
            Int8Linear(torch.eye(2), None)  # this build's quantized engine
        except PrecisionError as err:
            return str(err)
    return why


def resolve_precision(precision: str, device: str | torch.device = "cpu",
                      fallback: str | None = None) -> str:
    """The precision to serve: `precision` where it can run; else `fallback` ("fp32") with one
    warning that says why, when the user asked for a fallback; else a PrecisionError."""
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"inference precision {precision!r}: choose one of "
                         f"{', '.join(INFERENCE_PRECISIONS)}")
    why = unavailable(precision, device)
    if why is None:
        return precision
    if fallback is None:
        raise PrecisionError(f"{why} (or set precision_fallback / --precision-fallback fp32 "
                             "to serve float32 weights where this precision cannot run)")
    log.warning("%s inference is not available here: %s; serving %s weights instead, as "
                "precision_fallback=%r asks", precision, why, fallback, fallback)
    return fallback


def for_inference(net: nn.Module, precision: str = "fp32") -> nn.Module:
    """`net` (an eval copy with weight norm folded: `convs2s.model.network.inference_copy`)
    converted in place to `precision`; sets `net.precision`."""
    if precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"inference precision {precision!r}: choose one of "
                         f"{', '.join(INFERENCE_PRECISIONS)}")
    weights = MODES[precision].weights  # the precision table's inference conversion
    device = next(net.parameters()).device
    limited = MODES[precision].devices  # (None: any device torch runs on)
    if limited is not None and device.type not in limited:
        raise PrecisionError(f"{inference_unavailable(precision, device)} (the model is there)")
    if weights == "int8":
        _quantize(net)
    elif weights != "float32":
        net.to(getattr(torch, weights))
    net.precision = precision
    return net


def _quantize(net: nn.Module) -> None:
    """Every nn.Linear and every convolution's GEMM of `net` -> int8 (embeddings stay float)."""
    from convs2s.model.conv import Conv

    from torch.nn.utils import parametrize

    for module in list(net.modules()):
        if parametrize.is_parametrized(module):
            raise ValueError("int8 weights are made from an inference copy (weight norm folded: "
                             "convs2s.model.network.inference_copy), not from a training model")
        if isinstance(module, Conv):
            module.int8 = Int8Linear(module.weight.reshape(module.c_out, -1), module.bias)
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child.weight, child.bias))
