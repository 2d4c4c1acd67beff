"""Inference precision (convs2s.inference.quantize): int8 and bf16 copies of a trained model
translate
like its float32 weights (the same hypotheses on most sentences, scores close), every matrix
product of an int8 copy is int8, and what cannot be served says so.

The trained model is the session's `demo_trained` (tests/conftest.py).
Run: .venv/bin/python -m pytest tests/test_quantize.py -q
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from convs2s.config import PRESETS, SearchConfig
from convs2s.model.conv import Conv
from convs2s.model.network import ConvS2S, inference_copy
from convs2s.inference import quantize
from convs2s.inference.quantize import Int8Linear, PrecisionError, for_inference
from convs2s.metrics.scoring import read_lines
from convs2s.inference.translate import load_for_inference


def test_an_int8_linear_layer_is_close_to_its_float_weights():
    torch.manual_seed(0)
    lin = nn.Linear(96, 40)
    q = Int8Linear(lin.weight, lin.bias)
    x = torch.randn(7, 3, 96)
    with torch.no_grad():
        ref = lin(x)
    y = q(x)
    assert y.shape == ref.shape and y.dtype == torch.float32
    # 8-bit weights (per output channel) and 8-bit activations (per call): ~1% of the range
    assert float((y - ref).abs().max()) < 0.03 * float(ref.abs().max())


# A CPU without int8 dot products (AVX2-only hosts): fbgemm's AVX2 kernels, forced on any x86
# host by FBGEMM_ENABLE_INSTRUCTIONS, with the CPU-flag probe saying "no VNNI" (what such a host
# reads from /proc/cpuinfo). The kernels sum u8 x s8 pairs in 16 bits (`vpmaddubsw`).
_AVX2_ENV = {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
_NO_VNNI = "import convs2s.inference.quantize as q; q.has_int8_dot_products = lambda: False\n"
_x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                          reason="fbgemm's AVX2 kernels exist on x86-64 CPUs only")


def _python(code: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_SATURATION = _NO_VNNI + """
import json, torch, warnings
from convs2s.inference.quantize import Int8Linear, weight_levels
warnings.simplefilter("ignore")
torch.manual_seed(0)
x = torch.rand(64, 512) * 4 + 1.0  # positive and wide: u8 activations near 255
w = torch.randn(256, 512)
ref = x @ w.T
def err(y):
    return float((y - ref).abs().max() / ref.abs().max())
# what 8-bit weights and 8-bit activations give on these kernels (PyTorch's x86 engine)
torch.backends.quantized.engine = "x86"
scale = (w.abs().amax(1) / 127).double()
qw = torch.quantize_per_channel(w, scale, torch.zeros(256, dtype=torch.long), 0, torch.qint8)
plain = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(qw, None), False)
print(json.dumps({"levels": weight_levels(), "plain": err(plain),
                  "ours": err(Int8Linear(w, None)(x))}))
"""


@_x86
def test_int8_on_a_cpu_without_int8_dot_products_never_saturates():
    """Without VNNI the kernels' 16-bit pair sums saturate past 32,767: 8-bit weights times
    8-bit activations do (several % of the range lost), so such a host quantizes weights to
    7 bits (255 x 63 x 2 = 32,130) and stays within int8's rounding."""
    out = _python(_SATURATION, _AVX2_ENV)
    assert out["levels"] == 63
    assert out["plain"] > 0.03, out  # the forced AVX2 kernels do saturate 8 x 8 bits
    assert out["ours"] < 0.03, out


def test_the_weight_range_follows_the_engine_that_runs_the_products(monkeypatch):
    """8-bit weights need kernels that use the CPU's int8 dot products (oneDNN's); on a build
    without oneDNN the x86 engine's fbgemm may take its saturating AVX2 path (a CPU with
    AVX-VNNI but no AVX-512 VNNI), so weights keep 7 bits there whatever the CPU has."""
    from convs2s.inference import quantize

    if quantize.has_int8_dot_products() and "onednn" in quantize._supported_engines():
        assert quantize.weight_levels() == 127
    monkeypatch.setattr(quantize, "_supported_engines", lambda: ["x86", "fbgemm"])
    assert quantize.int8_engine() == "x86" and quantize.weight_levels() == 63


_TRANSLATE = _NO_VNNI + """
import json, sys
from convs2s.config import SearchConfig
from convs2s.metrics.scoring import read_lines
from convs2s.inference.translate import load_for_inference
ckpt, src = sys.argv[1:3]
lines = read_lines(src)[:60]
fp32 = load_for_inference([ckpt], SearchConfig(beam=5)).translate_full(lines)
low = load_for_inference([ckpt], SearchConfig(beam=5, precision="int8"))
out = low.translate_full(lines)
print(json.dumps({"engine": low.models[0].encoder.fc1.engine,
                  "pairs": [[a.hypotheses[0].text == b.hypotheses[0].text,
                             abs(a.hypotheses[0].score - b.hypotheses[0].score)]
                            for a, b in zip(fp32, out)]}))
"""


@_x86
def test_a_trained_model_translates_alike_in_int8_without_int8_dot_products(demo_trained):
    """The same bar as test_a_trained_model_translates_alike_at_lower_precision, on the kernels
    an AVX2-only host runs (PyTorch's 7-bit activations moved 20 of these 60 sentences)."""
    t = demo_trained
    code = _TRANSLATE.replace("sys.argv[1:3]", repr([str(t.train.best_checkpoint),
                                                     str(t.test_src)]))
    out = _python(code, _AVX2_ENV)
    assert out["engine"] in ("x86", "fbgemm")
    same = [s for s, _ in out["pairs"]]
    assert sum(same) >= 0.75 * len(same), sum(same)
    assert max(d for s, d in out["pairs"] if s) < 0.1


def test_every_matrix_product_of_an_int8_copy_is_int8_and_embeddings_stay_float():
    torch.manual_seed(0)
    net = for_inference(inference_copy(ConvS2S(PRESETS["tiny"](), 50, 50)), "int8")
    assert net.precision == "int8"
    assert not [n for n, m in net.named_modules() if type(m) is nn.Linear]
    convs = [m for m in net.modules() if isinstance(m, Conv)]
    assert convs and all(isinstance(c.int8, Int8Linear) for c in convs)
    assert net.encoder.embed_tokens.weight.dtype == torch.float32
    # the incremental step agrees with the full pass on the int8 weights too (to the rounding of
    # the activations, whose scale is taken per call: over all positions, or one)
    src = torch.randint(4, 50, (2, 6))
    enc = net.encode(src, torch.tensor([6, 6]))
    prev = torch.randint(4, 50, (2, 4))
    with torch.no_grad():
        full, _ = net.decode(prev, enc)
        state = net.init_state(enc)
        steps = [net.decode_step(prev[:, t], state)[0] for t in range(4)]
    assert float((torch.stack(steps, 1) - full).abs().max()) < 0.03 * float(full.abs().max())
    # vocabulary selection on an int8 copy: the shortlist's rows of fc3 as an int8 layer
    ids = torch.tensor([0, 1, 2, 3, 7, 11, 40])
    rows = net.output_rows(ids)
    assert isinstance(rows, Int8Linear) and rows.out_features == 7
    state = net.init_state(enc)
    short, _ = net.decode_step(prev[:, 0], state, rows=rows)
    assert short.shape == (2, 7)
    assert float((short - steps[0][:, ids]).abs().max()) < 0.03 * float(steps[0].abs().max())


def test_bad_precisions_are_refused_with_the_way_out(monkeypatch):
    net = inference_copy(ConvS2S(PRESETS["tiny"](), 50, 50))
    with pytest.raises(ValueError, match="choose one of fp32, bf16, int8"):
        for_inference(net, "int4")
    with pytest.raises(ValueError, match="precision must be"):
        SearchConfig(precision="fp16")
    on_meta = inference_copy(ConvS2S(PRESETS["tiny"](), 50, 50)).to("meta")
    with pytest.raises(PrecisionError, match="int8 inference runs on CPUs, not on meta"):
        for_inference(on_meta, "int8")
    monkeypatch.setattr(quantize, "_supported_engines", lambda: ["none"])
    with pytest.raises(PrecisionError, match="quantized CPU kernels.*use precision fp32"):
        for_inference(net, "int8")


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_trained_model_translates_alike_at_lower_precision(demo_trained, precision):
    t = demo_trained
    lines = read_lines(t.test_src)[:60]
    ckpt = [t.train.best_checkpoint]
    fp32 = load_for_inference(ckpt, SearchConfig(beam=5)).translate_full(lines)
    low = load_for_inference(ckpt, SearchConfig(beam=5, precision=precision))
    assert low.models[0].precision == precision
    out = low.translate_full(lines)
    same = [a.hypotheses[0].text == b.hypotheses[0].text for a, b in zip(fp32, out)]
    assert sum(same) >= 0.75 * len(lines), sum(same)
    # where the words agree, so do the scores (mean log-prob per token)
    diffs = [abs(a.hypotheses[0].score - b.hypotheses[0].score)
             for a, b, s in zip(fp32, out, same) if s]
    assert max(diffs) < 0.1, max(diffs)


def test_int8_without_kernels_fails_clearly_or_falls_back_to_fp32_only_when_asked(
        demo_trained, monkeypatch, caplog, capsys):
    from convs2s.cli import translate

    t = demo_trained
    lines = read_lines(t.test_src)[:20]
    ckpt = [str(t.train.best_checkpoint)]
    fp32 = load_for_inference(ckpt, SearchConfig(beam=2)).translate(lines)
    monkeypatch.setattr(quantize, "_supported_engines", lambda: [])  # a build without them
    # not asked: an error naming the missing kernels and both ways out
    with pytest.raises(PrecisionError, match="quantized CPU kernels.*use precision fp32.*"
                                             "--precision-fallback fp32"):
        load_for_inference(ckpt, SearchConfig(beam=2, precision="int8"))
    # asked: one warning, float32 weights, and the translator says what it serves
    caplog.set_level("WARNING", logger="convs2s.inference.quantize")
    tr = load_for_inference(ckpt, SearchConfig(beam=2, precision="int8",
                                               precision_fallback="fp32"))
    assert tr.search.precision == "fp32" and tr.models[0].precision == "fp32"
    assert tr.translate(lines) == fp32
    warned = [r.getMessage() for r in caplog.records if r.name == "convs2s.inference.quantize"]
    assert len(warned) == 1 and warned[0].startswith("int8 inference is not available here")
    assert "serving fp32" in warned[0]
    # the command line: exit 2 with one error line, or the fallback when the flag asks for it
    src = t.test_src
    assert translate(["--checkpoint", *ckpt, "--input", str(src), "--precision", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("convs2s-translate: error: int8 inference needs")
    assert translate(["--checkpoint", *ckpt, "--input", str(src), "--precision", "int8",
                      "--precision-fallback", "fp32", "--beam", "2"]) == 0
    with pytest.raises(ValueError, match="precision_fallback must be None or 'fp32'"):
        SearchConfig(precision="int8", precision_fallback="bf16")
