"""Tests of convs2s.model.loss: the fused output-layer loss used in training equals the plain
definition (`sequence_loss` on the logits) in value and gradient, whatever the chunking.

Run: .venv/bin/python -m pytest tests/test_loss.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convs2s.model.loss as loss_module
from convs2s.config import EOS, PAD, PRESETS
from convs2s.model.loss import output_layer_loss, sequence_loss
from convs2s.model.network import ConvS2S


def _problem(B=3, T=7, C=5, V=11, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, C, generator=g, dtype=dtype).to(device).requires_grad_()
    w = torch.randn(V, C, generator=g, dtype=dtype).to(device).requires_grad_()
    b = torch.randn(V, generator=g, dtype=dtype).to(device).requires_grad_()
    target = torch.randint(0, V, (B, T), generator=g)
    target[0, 5:] = PAD  # padded rows contribute nothing, and get zero gradient
    target[2, 2:] = PAD
    return h, w, b, target.to(device)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_values", [11, 30, 2**20], ids=["row", "3rows", "whole"])
def test_fused_loss_equals_sequence_loss_on_the_logits(eps, chunk_values, monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_VALUES", {"cpu": chunk_values})
    monkeypatch.setattr(loss_module, "MIN_CHUNK_ROWS", 1)
    assert loss_module.chunk_rows("cpu", 11) == max(1, chunk_values // 11)
    h, w, b, target = _problem()
    loss, nll = output_layer_loss(h, w, b, target, eps)
    grads = torch.autograd.grad(loss * 1.7, (h, w, b))  # a non-unit upstream gradient
    ref_loss, ref_nll = sequence_loss(F.linear(h, w, b), target, eps)
    ref_grads = torch.autograd.grad(ref_loss * 1.7, (h, w, b))
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    assert not nll.requires_grad and loss.dtype == nll.dtype == torch.float32
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert grads[0][0, 5:].abs().max() == 0 and grads[0][2, 2:].abs().max() == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_chunks_give_the_eager_loss_and_gradients(backend, compile_state, monkeypatch):
    """`compile_loss_chunks`: the element-wise work of each chunk compiled (fused kernels under
    Inductor) gives the eager chunks' loss and gradients, with and without smoothing, for
    chunks of every row count from one capture (dynamic shapes: a second capture is an error
    here), and without gradients (validation) the same values."""
    monkeypatch.setattr(loss_module, "CHUNK_VALUES", {"cpu": 7 * 11})  # 7-row chunks, then 4
    monkeypatch.setattr(loss_module, "MIN_CHUNK_ROWS", 1)
    h, w, b, target = _problem(B=4, T=6)  # 18 non-pad rows
    runs = {}
    for name in ("eager", backend):
        loss_module.compile_loss_chunks(None if name == "eager" else backend, devices=("cpu",))
        for eps in (0.1, 0.0):  # (each rate its own capture: rates are constants in the graph)
            output_layer_loss(h[:1], w, b, target[:1], eps)  # captured on one 5-row chunk
            with torch.no_grad():
                output_layer_loss(h[:1], w, b, target[:1], eps)
            with torch.compiler.set_stance("fail_on_recompile"):
                loss, nll = output_layer_loss(h, w, b, target, eps)  # 7, 7 and 4 rows
                with torch.no_grad():
                    values = output_layer_loss(h, w, b, target, eps)
            grads = torch.autograd.grad(loss * 1.7, (h, w, b))
            runs[name, eps] = (loss, nll, *grads, *values)
    for eps in (0.1, 0.0):
        for got, ref in zip(runs[backend, eps], runs["eager", eps]):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_fused_loss_without_grad_gives_the_same_values():
    h, w, b, target = _problem()
    with torch.no_grad():
        loss, nll = output_layer_loss(h, w, b, target, 0.1)
    ref_loss, ref_nll = sequence_loss(F.linear(h, w, b), target, 0.1)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)


def test_rows_found_by_the_collate_give_the_same_loss_and_gradients():
    """The training step passes the non-pad rows the collate found on the host
    (`Batch.target_rows`), so that the loss never asks the device for them: the same values
    and gradients as rows found in the loss."""
    import numpy as np

    from convs2s.train.collate import collate_lists

    batch = collate_lists([[5, 6, EOS], [7, EOS]], [[8, 9, 10, EOS], [11, EOS]])
    assert batch.target_rows.tolist() == \
        batch.target.reshape(-1).ne(PAD).nonzero().squeeze(1).tolist() == [0, 1, 2, 3, 4, 5]
    h, w, b, target = _problem()
    rows = torch.from_numpy(np.flatnonzero(target.reshape(-1).numpy() != PAD))
    given = output_layer_loss(h, w, b, target, 0.1, target_rows=rows)
    found = output_layer_loss(h, w, b, target, 0.1)
    torch.testing.assert_close(given, found)
    torch.testing.assert_close(torch.autograd.grad(given[0], (h, w, b)),
                               torch.autograd.grad(found[0], (h, w, b)))


def test_fused_loss_refuses_bad_smoothing():
    h, w, b, target = _problem()
    with pytest.raises(ValueError, match="label_smoothing"):
        output_layer_loss(h, w, b, target, 1.0)


@pytest.mark.parametrize("tied", [False, True])
def test_model_target_path_equals_the_loss_of_its_logits(tied):
    """model(..., target=) is the training path: same loss and parameter gradients as
    sequence_loss on model(...)'s logits (dropout off so both passes see the same network)."""
    cfg = PRESETS["tiny"]().replace(dropout=0.0, share_decoder_embed=tied,
                                  out_embed_dim=PRESETS["tiny"]().embed_dim)
    torch.manual_seed(0)
    model = ConvS2S(cfg, 40, 40).train()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 6), generator=g)
    prev = torch.randint(4, 40, (3, 5), generator=g)
    prev[:, 0] = EOS
    target = torch.randint(4, 40, (3, 5), generator=g)
    target[1, 3:] = PAD
    loss, nll = model(src, src.ne(PAD).sum(1), prev, target=target, label_smoothing=0.1)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits, _ = model(src, src.ne(PAD).sum(1), prev)
    ref_loss, ref_nll = sequence_loss(logits, target, 0.1)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.gpu
def test_fused_loss_under_bf16_autocast_on_gpu():
    """Under bf16 autocast the matmuls run in bf16 and the softmax in float32: the loss stays
    within bf16 tolerance of float32, and the gradients point the same way."""
    h, w, b, target = _problem(B=16, T=30, C=256, V=8000, device="cuda")
    ref_loss, _ = output_layer_loss(h, w, b, target, 0.1)
    ref_grads = torch.autograd.grad(ref_loss, (h, w, b))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = output_layer_loss(h, w, b, target, 0.1)
    grads = torch.autograd.grad(loss, (h, w, b))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref_loss.item(), rel=2e-2)
    for got, ref in zip(grads, ref_grads):
        assert got.dtype == ref.dtype
        assert F.cosine_similarity(got.float().flatten(), ref.flatten(), dim=0) > 0.98


@pytest.mark.gpu
def test_compiled_chunks_under_bf16_autocast_on_gpu_match_the_eager_chunks(compile_state):
    """On CUDA, where `compile_for_training` compiles the chunks by default: Inductor's fused
    kernels give the eager chunks' loss and, in bf16, the same gradients up to rounding."""
    h, w, b, target = _problem(B=16, T=30, C=256, V=8000, device="cuda")
    runs = []
    for backend in (None, "inductor"):
        loss_module.compile_loss_chunks(backend)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll = output_layer_loss(h, w, b, target, 0.1)
        runs.append((loss, nll, *torch.autograd.grad(loss, (h, w, b))))
    (loss, nll, *grads), (c_loss, c_nll, *c_grads) = runs
    assert c_loss.item() == pytest.approx(loss.item(), rel=1e-4)
    assert c_nll.item() == pytest.approx(nll.item(), rel=1e-4)
    for got, ref in zip(c_grads, grads):
        assert got.dtype == ref.dtype
        assert F.cosine_similarity(got.float().flatten(), ref.float().flatten(), dim=0) > 0.9999


def test_fused_loss_backward_twice_gives_the_same_gradients():
    """The gradients formed in the forward are scaled out of place: a retained graph can be
    differentiated again (e.g. by gradient checks) without scaling them twice."""
    h, w, b, target = _problem()
    loss, _ = output_layer_loss(h, w, b, target, 0.1)
    first = torch.autograd.grad(loss * 3.0, (h, w, b), retain_graph=True)
    second = torch.autograd.grad(loss * 3.0, (h, w, b))
    for x, y in zip(first, second):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_values", [11, 30, 2**20], ids=["row", "3rows", "whole"])
def test_static_shapes_mask_the_pad_rows_to_the_same_loss_and_gradients(
        eps, chunk_values, monkeypatch):
    """The masked variant (a bool mask as `target_rows`: every row computed, the pad rows
    masked out, the form a CUDA graph can capture) gives the loss and gradients of the gathered
    rows, whatever the chunking."""
    monkeypatch.setattr(loss_module, "CHUNK_VALUES", {"cpu": chunk_values})
    monkeypatch.setattr(loss_module, "MIN_CHUNK_ROWS", 1)
    h, w, b, target = _problem()
    runs = []
    mask = target.reshape(-1) != PAD
    for kwargs in ({}, {"target_rows": mask}):
        loss, nll = output_layer_loss(h, w, b, target, eps, **kwargs)
        runs.append((loss, nll, *torch.autograd.grad(loss * 1.7, (h, w, b))))
    for masked in runs[1:]:
        for got, ref in zip(masked, runs[0]):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    grad_h = runs[1][2]
    assert grad_h[0, 5:].abs().max() == 0 and grad_h[2, 2:].abs().max() == 0
    with torch.no_grad():
        values = output_layer_loss(h, w, b, target, eps, target_rows=mask)
    torch.testing.assert_close(values, runs[0][:2])


def test_static_shapes_compile_once_for_every_token_count(compile_state):
    """With static shapes, batches of one padded shape but different numbers of target tokens
    are one graph (no recompile, as a CUDA graph replay needs); gathered rows change shape with
    the token count, and a shape-specialized compile captures again. The compiled masked chunk
    (the fused `torch.where` form) gives the eager values and gradients."""
    calls = []

    def counting(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm

    def loss_of(h, w, b, target, **kwargs):
        return output_layer_loss(h, w, b, target, 0.1, **kwargs)[0]

    h, w, b, target = _problem()
    fewer = target.clone()
    fewer[1, 3:] = PAD
    for static, graphs in ((True, 1), (False, 2)):
        calls.clear()
        torch._dynamo.reset()
        fn = torch.compile(loss_of, backend=counting, dynamic=False, fullgraph=True)
        for t in (target, fewer):
            rows = t.reshape(-1).ne(PAD).nonzero().squeeze(1)  # as the collate gives them
            fn(h, w, b, t, target_rows=t.reshape(-1).ne(PAD) if static else rows)
        assert len(calls) == graphs, (static, calls)

    loss_module.compile_loss_chunks("aot_eager", devices=("cpu",))
    for t in (target, fewer):
        compiled = output_layer_loss(h, w, b, t, 0.1, target_rows=t.reshape(-1).ne(PAD))
        c_grads = torch.autograd.grad(compiled[0], (h, w, b))
        loss_module.compile_loss_chunks(None)
        eager = output_layer_loss(h, w, b, t, 0.1)
        grads = torch.autograd.grad(eager[0], (h, w, b))
        loss_module.compile_loss_chunks("aot_eager", devices=("cpu",))
        torch.testing.assert_close(compiled, eager)
        for got, ref in zip(c_grads, grads):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_static_shapes_loss_and_backward_replay_in_a_cuda_graph():
    """The masked loss and its backward captured in one CUDA graph: replayed on a new batch of
    the same shape with fewer tokens, it gives what the eager gathered path gives."""
    h, w, b, target = _problem(B=16, T=30, C=256, V=8000, device="cuda")
    static_h = h.detach().clone().requires_grad_()
    static_target = target.clone()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll = output_layer_loss(static_h, w, b, static_target, 0.1,
                                          target_rows=static_target.reshape(-1).ne(PAD))
        return (loss, nll, *torch.autograd.grad(loss, (static_h, w, b)))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graphs asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    h2, _, _, target2 = _problem(B=16, T=30, C=256, V=8000, seed=1, device="cuda")
    target2[:, 20:] = PAD
    with torch.no_grad():
        static_h.copy_(h2)
    static_target.copy_(target2)
    graph.replay()
    torch.cuda.synchronize()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, nll = output_layer_loss(static_h, w, b, static_target, 0.1)
    ref = (loss, nll, *torch.autograd.grad(loss, (static_h, w, b)))
    assert out[0].item() == pytest.approx(ref[0].item(), rel=1e-4)
    assert out[1].item() == pytest.approx(ref[1].item(), rel=1e-4)
    for got, want in zip(out[2:], ref[2:]):
        assert F.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0) > 0.9999
    assert out[2][:, 20:].abs().max() == 0  # the pad rows get no gradient


def test_the_fused_operator_called_without_gradients_refuses_to_go_backward():
    """`convs2s::output_loss` computes its gradients in the forward, only with `with_grad`
    (output_layer_loss passes it as autograd needs). Called directly with with_grad=False on
    inputs that require gradients, its backward had none: an index_copy_ shape error, or
    gradients of the wrong shape. Now one error naming the fix."""
    torch.manual_seed(0)
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    b = torch.zeros(11, requires_grad=True)
    target = torch.tensor([5, 6, 7, 1, 1, 2])
    for rows in (target.ne(1).nonzero().squeeze(1), target.ne(1)):
        loss, *_ = torch.ops.convs2s.output_loss(h, w, b, target, rows, 0.1, False,
                                                 torch.float32)
        with pytest.raises(RuntimeError, match="with_grad=False on inputs that require "
                                               "gradients.*call output_layer_loss"):
            loss.backward()
