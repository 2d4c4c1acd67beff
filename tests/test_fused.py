"""The element-wise work between a block's products compiled as four shared functions
(`convs2s.model.fused`, TrainConfig.fuse): the same training as eager, one compile for every
block and batch shape, eager wherever autograd does not record."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from convs2s.config import EOS, PAD, ModelConfig
from convs2s.model import fused
from convs2s.model.network import Attention, Block, ConvS2S

# Mixed widths (residual projections), kernels 1 to 5, attention in a subset of the layers.
MIXED = ModelConfig(embed_dim=24, encoder_layers=[(16, 3), (16, 2), (32, 5), (24, 1)],
                    decoder_layers=[(16, 3), (32, 2), (32, 1), (24, 5)], out_embed_dim=20,
                    decoder_attention=(True, False, True, True), dropout=0.1, max_positions=64)


def _batch(B: int, S: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (B, S), generator=g)
    src[0, :2] = PAD  # left padding: the mask and the length scale matter
    prev = torch.randint(4, 60, (B, T), generator=g)
    prev[:, 0] = EOS
    target = torch.roll(prev, -1, 1)
    target[-1, T // 2:] = PAD
    return src, src.ne(PAD).sum(1), prev, target


def _train_step(model, batch, dtype=None):
    """Loss and every parameter's gradient of one training forward (fixed dropout masks)."""
    model.zero_grad()
    torch.manual_seed(7)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss, _ = model(*batch[:3], target=batch[3], label_smoothing=0.1)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture
def restore_dynamo(compile_state):
    """torch's process-wide settings the compiled regions set, put back after the test
    (tests/conftest.py `compile_state`)."""
    yield


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_regions_train_the_same_model_once_compiled_for_every_block_and_shape(
        backend, restore_dynamo):
    """Every block and attention layer gets the compiled table; one training step gives eager's
    loss and gradients (float32), and a batch of other lengths and sentence counts, through
    blocks of four widths, compiles nothing more (a recompile is an error here). Validation
    (no autograd) runs the eager functions, compiling nothing either."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = ConvS2S(MIXED, 50, 60).train()
    first, second = _batch(3, 7, 6, seed=1), _batch(5, 9, 8, seed=2)
    want = [_train_step(model, b) for b in (first, second)]
    n = fused.fuse_regions(model, backend)
    assert n == len(MIXED.encoder_layers) + len(MIXED.decoder_layers) + 3  # + attention layers
    assert all(m.fused.backend == backend for m in model.modules()
               if isinstance(m, (Block, Attention)))
    graphs = counters["stats"]["unique_graphs"]
    got = [_train_step(model, first)]  # compiles here: the four functions at least
    assert counters["stats"]["unique_graphs"] >= graphs + 4
    with torch.compiler.set_stance("fail_on_recompile"):
        got.append(_train_step(model, second))
        with torch.no_grad():
            model.eval()
            logits, attn = model(*second[:3])
    for (loss, grads), (ref_loss, ref_grads) in zip(got, want):
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    fused.fuse_regions(model, None)
    assert all(m.fused is fused.EAGER for m in model.modules() if hasattr(m, "fused"))
    ref_logits, ref_attn = model(*second[:3])
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(attn, ref_attn)


def test_a_backend_torch_compile_does_not_know_is_refused_before_any_step():
    model = ConvS2S(MIXED, 50, 60)
    with pytest.raises(ValueError, match="fuse='inducter' is not a torch.compile backend; give "
                                         "one of .*inductor"):
        fused.fuse_regions(model, "inducter")
    assert all(m.fused is fused.EAGER for m in model.modules() if hasattr(m, "fused"))


def test_scaling_the_attention_weights_is_scaling_the_context():
    """§3.4's sqrt(m) is applied to the attention weights before the product with the values
    (a pass over S values a row, not E): the context the paper's order gives, and the weights
    themselves unscaled, padding at 0."""
    torch.manual_seed(0)
    scores, values = torch.randn(2, 5, 6), torch.randn(2, 6, 8)
    mask = torch.zeros(2, 1, 6)
    mask[0, :, 4:] = float("-inf")
    scale = torch.tensor([4.0, 6.0]).sqrt().view(2, 1, 1)
    attn, weights = fused.attention_weights(scores, mask, scale, torch.float32)
    torch.testing.assert_close(attn, torch.softmax(scores + mask, -1))
    assert attn[0, :, 4:].abs().max() == 0
    torch.testing.assert_close(torch.bmm(weights, values), torch.bmm(attn, values) * scale)


@pytest.mark.gpu
def test_compiled_regions_under_bf16_autocast_on_a_gpu_match_eager(restore_dynamo):
    """On CUDA under bf16 autocast, Inductor's fused kernels (Triton) train the paper's blocks
    as the eager functions do, up to bf16 rounding."""
    from convs2s.config import PRESETS

    dev = torch.device("cuda")
    cfg = PRESETS["iwslt_de_en"]().replace(dropout=0.0)
    torch.manual_seed(0)
    model = ConvS2S(cfg, 1000, 1000).to(dev).train()
    src, lengths, prev, target = (t.to(dev) for t in _batch(16, 30, 28, seed=3))
    src, prev = src.clamp(max=999), prev.clamp(max=999)
    runs = []
    for backend in (None, "inductor"):
        fused.fuse_regions(model, backend)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = model(src, lengths, prev, target=target, label_smoothing=0.1)
        loss.backward()
        runs.append((loss.item(), [p.grad.float().flatten() for p in model.parameters()]))
    (loss, grads), (c_loss, c_grads) = runs
    assert c_loss == pytest.approx(loss, rel=1e-3)
    for got, ref in zip(c_grads, grads):
        if ref.norm() > 0:
            assert F.cosine_similarity(got, ref, dim=0) > 0.999
