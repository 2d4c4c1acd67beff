"""Tests of convs2s.model.network: shapes, parameter counts, causality, padding invariance,
incremental
decoding parity, initialization, bf16 autocast (GPU) and torch.compile.

Run: .venv/bin/python -m pytest tests/test_model.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from convs2s.config import EOS, PAD, PRESETS, ModelConfig
from convs2s.model.network import ConvS2S, inference_copy

TINY = PRESETS["tiny"]()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small models gain nothing from intra-op threads, and one thread avoids OpenMP stalls
    (measured 50x) when the two cores are shared with other processes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
# Mixed widths (residual projections), kernels 1, 2 (even), 3 and 5, attention in a subset.
MIXED = ModelConfig(
    embed_dim=24,
    encoder_layers=[(16, 3), (16, 2), (32, 5), (24, 1)],
    decoder_layers=[(16, 3), (32, 2), (32, 1), (24, 5)],
    out_embed_dim=20,
    decoder_attention=(True, False, True, True),
    dropout=0.1,
    max_positions=64,
)


def make_batch(B=3, S=7, T=6, src_vocab=50, tgt_vocab=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, src_vocab, (B, S), generator=g)
    lengths = torch.full((B,), S)
    prev = torch.randint(4, tgt_vocab, (B, T), generator=g)
    prev[:, 0] = EOS
    return src, lengths, prev


def model_for(cfg, seed=0, src_vocab=50, tgt_vocab=60):
    torch.manual_seed(seed)
    return ConvS2S(cfg, src_vocab, tgt_vocab).eval()


@pytest.mark.parametrize("cfg", [TINY, MIXED], ids=["tiny", "mixed"])
def test_forward_shapes(cfg):
    model = model_for(cfg)
    src, lengths, prev = make_batch()
    logits, attn = model(src, lengths, prev)
    assert logits.shape == (3, 6, 60) and logits.dtype == torch.float32
    assert attn.shape == (3, 6, 7)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 6))
    assert model.max_positions == cfg.max_positions


def test_backward_reaches_every_parameter():
    model = model_for(MIXED).train()
    src, lengths, prev = make_batch()
    logits, _ = model(src, lengths, prev)
    logits.logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    # The pad rows get no gradient but the tables do; every parameter takes part.
    assert not missing, missing


# Reference counts (docs/reference.md, Presets): two 40k vocabularies, 1024 positions, gains
# included.
@pytest.mark.parametrize("name,millions", [
    ("iwslt_de_en", 34.7), ("wmt16_en_ro", 137.1), ("wmt14_en_de", 209.6), ("wmt14_en_fr", 258.1),
])
def test_parameter_counts(name, millions):
    with torch.device("meta"):  # no memory, no init cost
        model = ConvS2S(PRESETS[name]().replace(max_positions=1024), 40_000, 40_000)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / 1e6 - millions) / millions < 0.005, n
    # Weight norm on every conv and linear (a gain g and a direction v), none on embeddings.
    names = [n for n, _ in model.named_parameters()]
    assert not any("embed" in n and "original" in n for n in names)
    gains = sum(n.endswith("original0") for n in names)
    assert gains == sum(n.endswith("original1") for n in names) > 0


def test_causality():
    """Changing target token t changes no output before t (and does change outputs from t)."""
    model = model_for(MIXED)
    src, lengths, prev = make_batch(T=8)
    logits, attn = model(src, lengths, prev)
    for t in (1, 4, 7):
        prev2 = prev.clone()
        prev2[:, t] = (prev2[:, t] + 1 - 4) % 56 + 4
        logits2, attn2 = model(src, lengths, prev2)
        torch.testing.assert_close(logits2[:, :t], logits[:, :t], rtol=0, atol=0)
        torch.testing.assert_close(attn2[:, :t], attn[:, :t], rtol=0, atol=0)
        assert (logits2[:, t] - logits[:, t]).abs().max() > 1e-4


@pytest.mark.parametrize("side", ["left", "right"])
def test_source_padding_invariance(side):
    model = model_for(MIXED)
    src, lengths, prev = make_batch()
    logits, attn = model(src, lengths, prev)
    pad = torch.full((3, 4), PAD)
    src_p = torch.cat([pad, src], 1) if side == "left" else torch.cat([src, pad], 1)
    logits_p, attn_p = model(src_p, lengths, prev)
    torch.testing.assert_close(logits_p, logits, rtol=0, atol=1e-5)
    real = attn_p[:, :, 4:] if side == "left" else attn_p[:, :, :7]
    torch.testing.assert_close(real, attn, rtol=0, atol=1e-5)
    assert attn_p.sum() - real.sum() == 0  # padding receives exactly zero attention


def test_mixed_lengths_match_single_sentences():
    """A padded batch of different lengths equals running each sentence alone."""
    model = model_for(MIXED)
    src, _, prev = make_batch(B=2, S=9)
    src[0, :3] = PAD  # left-padded sentence of length 6
    src[1, 5:] = PAD  # right-padded sentence of length 5
    lengths = torch.tensor([6, 5])
    logits, _ = model(src, lengths, prev)
    for b, keep in ((0, slice(3, 9)), (1, slice(0, 5))):
        alone, _ = model(src[b:b + 1, keep], lengths[b:b + 1], prev[b:b + 1])
        torch.testing.assert_close(logits[b:b + 1], alone, rtol=0, atol=1e-5)


NO_POSITIONS = {"no source positions": {"src_positions": False},
                "no target positions": {"tgt_positions": False},
                "no positions": {"src_positions": False, "tgt_positions": False}}


@pytest.mark.parametrize("off", list(NO_POSITIONS.values()), ids=list(NO_POSITIONS))
def test_a_model_without_position_embeddings_decodes_like_its_full_pass(off):
    """Table 4's ablation: no position table on that side (no parameters, no state-dict key),
    incremental decoding still equals the full pass, the length limit stays, and the
    other side is the default model's."""
    cfg = TINY.replace(**off)
    model = model_for(cfg)
    keys = set(model.state_dict())
    for side, flag in (("encoder", "src_positions"), ("decoder", "tgt_positions")):
        assert (f"{side}.embed_positions.weight" in keys) == cfg.to_dict()[flag]
    net = inference_copy(model)
    src, lengths, prev = make_batch(B=2, S=7, T=5)
    with torch.no_grad():
        state = net.init_state(net.encode(src, lengths))
        full, _ = model(src, lengths, prev)
        for t in range(prev.shape[1]):
            step, _ = net.decode_step(prev[:, t], state)
            torch.testing.assert_close(F.log_softmax(step, -1), F.log_softmax(full[:, t], -1),
                                       rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.full((1, cfg.max_positions + 1), 5), torch.tensor([cfg.max_positions + 1]),
              prev[:1])
    if not cfg.src_positions:  # tokens alone: the same word at two positions embeds the same
        e = model.encoder.embed(torch.tensor([[7, 9, 7]]), torch.tensor([[2, 3, 4]]))
        torch.testing.assert_close(e[0, 0], e[0, 2])
    assert cfg == type(cfg).from_dict(cfg.to_dict())


def test_a_config_saved_before_the_position_switches_loads_with_them_on():
    old = {k: v for k, v in TINY.to_dict().items() if k not in ("src_positions",
                                                                  "tgt_positions")}
    cfg = type(TINY).from_dict(old)
    assert cfg.src_positions and cfg.tgt_positions


@pytest.mark.parametrize("cfg", [TINY, MIXED], ids=["tiny", "mixed"])
def test_incremental_parity_with_reordering(cfg):
    """Each incremental step's log-probs equal the full forward's (|diff| <= 1e-5), while the
    rows are shuffled between steps as beam search does."""
    model = model_for(cfg)
    net = inference_copy(model)
    B, T = 4, 9
    src, lengths, prev = make_batch(B=B, S=7, T=T)
    src[1, :2] = PAD
    src[2, 5:] = PAD
    lengths = src.ne(PAD).sum(1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        state = net.init_state(net.encode(src, lengths))
        prefix = prev[:, :0]
        src_now = src
        for t in range(T):
            rows = torch.randperm(B, generator=g)  # hypotheses move rows (and sentences)
            state.reorder(rows, sentences=rows)  # K = 1: rows are sentences
            prefix, src_now = prefix[rows], src_now[rows]
            new = torch.randint(4, 60, (B,), generator=g) if t else torch.full((B,), EOS)
            prefix = torch.cat([prefix, new[:, None]], 1)
            out = torch.empty(B, 60) if t % 2 else None  # odd steps: into a given buffer
            step_logits, step_attn = net.decode_step(new, state, out=out)
            assert out is None or step_logits.data_ptr() == out.data_ptr()
            full_logits, full_attn = model(src_now, src_now.ne(PAD).sum(1), prefix)
            torch.testing.assert_close(F.log_softmax(step_logits, -1),
                                       F.log_softmax(full_logits[:, -1], -1), rtol=0, atol=1e-5)
            torch.testing.assert_close(step_attn, full_attn[:, -1], rtol=0, atol=1e-5)


def test_block_step_equals_block_forward_at_every_position():
    """Each decoder block's incremental step (§5.3), fed one frame at a time with its conv
    buffer, gives its full forward's output and attention at that position: kernels 3, 2
    (even), 1 (no buffer) and 5, residual projections, with and without attention."""
    model = model_for(MIXED)
    B, K, T = 2, 3, 6
    src, _, _ = make_batch(B=B)
    src[0, :2] = PAD
    torch.manual_seed(0)
    with torch.no_grad():
        enc = model.encode(src, src.ne(PAD).sum(1))
        g = torch.randn(B * K, T, MIXED.embed_dim)  # K rows per sentence, as in a beam
        for block in model.decoder.blocks:
            x = torch.randn(B * K, T, block.conv.c_in)
            full, full_attn = block(x, g=g, enc=enc)
            buffer = block.conv.init_buffer(B * K, x.device, x.dtype)
            assert (buffer is None) == (block.kernel == 1)
            for t in range(T):
                y, attn, buffer = block.step(x[:, t:t + 1], buffer, g[:, t:t + 1], enc)
                torch.testing.assert_close(y, full[:, t:t + 1], rtol=0, atol=1e-5)
                assert (attn is None) == (block.attention is None) == (full_attn is None)
                if attn is not None:
                    torch.testing.assert_close(attn, full_attn[:, t:t + 1], rtol=0, atol=1e-6)


def test_state_dict_keys_are_those_of_saved_checkpoints():
    """Checkpoints (and the reference comparison) rely on these parameter names, in this order
    (the optimizer state follows it), and on the conv weight layout C_out x k x C_in."""
    model = model_for(MIXED)

    def wn(name):  # a weight-normed layer: bias, gain g, direction v
        return [f"{name}.bias", f"{name}.parametrizations.weight.original0",
                f"{name}.parametrizations.weight.original1"]

    want = []
    for side, layers, attention in (("encoder", MIXED.encoder_layers, (False,) * 4),
                                    ("decoder", MIXED.decoder_layers, MIXED.attention_layers)):
        want += [f"{side}.embed_tokens.weight", f"{side}.embed_positions.weight"]
        want += wn(f"{side}.fc1")
        c_in = layers[0][0]
        for i, ((c_out, _), att) in enumerate(zip(layers, attention)):
            want += wn(f"{side}.blocks.{i}.proj") if c_in != c_out else []
            want += wn(f"{side}.blocks.{i}.conv")
            want += wn(f"{side}.blocks.{i}.attention.in_proj") if att else []
            want += wn(f"{side}.blocks.{i}.attention.out_proj") if att else []
            c_in = c_out
        want += wn(f"{side}.fc2")
    want += wn("decoder.fc3")
    state = model.state_dict()
    assert list(state) == want
    assert [n for n, _ in model.named_parameters()] == want
    assert state["decoder.blocks.3.conv.parametrizations.weight.original1"].shape == (48, 5, 32)
    assert state["decoder.blocks.1.proj.parametrizations.weight.original1"].shape == (32, 16)


def test_inference_copy_folds_weight_norm_and_keeps_outputs():
    model = model_for(MIXED)
    net = inference_copy(model)
    assert not any("original" in n for n, _ in net.named_parameters())
    assert any("original" in n for n, _ in model.named_parameters())  # the original is untouched
    src, lengths, prev = make_batch()
    with torch.no_grad():
        torch.testing.assert_close(net(src, lengths, prev)[0], model(src, lengths, prev)[0],
                                   rtol=0, atol=1e-5)


def test_initialization_keeps_activation_scale():
    """Appendix A: with dropout off, each block of a 20-layer stack keeps the std of its input
    within a factor 2, in the encoder and in the decoder."""
    cfg = ModelConfig(embed_dim=256, encoder_layers=[(256, 3)] * 20,
                      decoder_layers=[(256, 3)] * 20, out_embed_dim=256, dropout=0.0)
    model = model_for(cfg, src_vocab=1000, tgt_vocab=1000)
    src, lengths, prev = make_batch(B=8, S=30, T=30, src_vocab=1000, tgt_vocab=1000)
    stds: dict[str, list[float]] = {"encoder": [], "decoder": []}
    for side in stds:
        stack = getattr(model, side)
        # The input of block l+1's conv is block l's output; fc2's input is the last block's.
        for m in [blk.conv for blk in stack.blocks] + [stack.fc2]:
            m.register_forward_hook(lambda m, i, o, s=side: stds[s].append(i[0].std().item()))
    with torch.no_grad():
        model(src, lengths, prev)
    for side, s in stds.items():
        inp, outs = s[0], s[1:]  # fc1 output (the first block's input), then 20 block outputs
        assert len(outs) == 20
        for k, v in enumerate(outs):
            assert inp / 2 < v < inp * 2, (side, k, inp, v)
    # The paper's point is the dropout factor: with dropout, weights are larger by 1/sqrt(p).
    w0 = ConvS2S(cfg.replace(dropout=0.0), 10, 10).encoder.blocks[0].conv.weight.std()
    w2 = ConvS2S(cfg.replace(dropout=0.5), 10, 10).encoder.blocks[0].conv.weight.std()
    assert math.isclose((w0 / w2).item(), math.sqrt(2), rel_tol=0.05)


def test_tied_output_embedding():
    cfg = MIXED.replace(out_embed_dim=24, share_decoder_embed=True)
    model = model_for(cfg)
    assert model.decoder.fc3.weight is model.decoder.embed_tokens.weight
    net = inference_copy(model)
    assert net.decoder.fc3.weight is net.decoder.embed_tokens.weight
    src, lengths, prev = make_batch()
    with torch.no_grad():
        torch.testing.assert_close(net(src, lengths, prev)[0], model(src, lengths, prev)[0],
                                   rtol=0, atol=1e-5)


def test_encoder_gradient_scaling():
    """§3.4: gradients reaching the encoder output are divided by 2 x attention layers, and the
    forward value is unchanged."""
    model = model_for(MIXED)  # 3 attention layers -> 1/6
    src, lengths, _ = make_batch()
    v = model.encoder.fc2.parametrizations.weight.original1
    enc = model.encode(src, lengths)
    grad = torch.autograd.grad(enc.keys.sum(), v)[0]
    model.encoder.grad_scale = 1.0
    enc1 = model.encode(src, lengths)
    grad1 = torch.autograd.grad(enc1.keys.sum(), v)[0]
    torch.testing.assert_close(enc1.keys, enc.keys, rtol=0, atol=0)
    torch.testing.assert_close(grad * 6, grad1)


def test_the_native_convolution_is_exact_float32_on_cudnn_as_the_windows_gemm_is():
    """cuDNN's float32 convolutions default to TF32 (about 1e-3 relative error) where the
    windows' GEMM and every matrix product are exact float32: `conv="native"` turns TF32 off
    for them, so a float32 run's numbers do not depend on `conv` (the flag is read on a GPU;
    set here all the same)."""
    from convs2s.model.conv import use_native_conv

    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
        assert use_native_conv(ConvS2S(PRESETS["tiny"](), 20, 20), True) > 0
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("conv", ["windows", "native"])
def test_torch_compile_matches_eager(conv):
    """torch.compile captures the whole model as one graph (custom autograd functions, in-place
    ops, weight norm parametrizations; the windows' GEMM or the library's convolution,
    `use_native_conv`) with the same outputs and gradients as eager.

    The `aot_eager` backend runs the graphs that Dynamo and AOTAutograd capture, without
    Inductor's code generation: what can go wrong in *our* code is the capture (a wrong guard,
    a mutation lost in functionalization, a custom backward dropped), and this checks it in
    seconds where Inductor's C++ compilation takes a minute on CPU."""
    from convs2s.model.conv import use_native_conv

    model = model_for(MIXED)  # eval mode: dropout off, so both runs are deterministic
    use_native_conv(model, conv == "native")
    src, lengths, prev = make_batch()
    src[0, :2] = PAD
    ref_logits, ref_attn = model(src, lengths, prev)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    logits, attn = compiled(src, lengths, prev)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn, ref_attn, rtol=1e-5, atol=1e-5)
    logits.logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_logits.logsumexp(-1).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.gpu
def test_bf16_autocast_matches_fp32_on_gpu():
    """bf16 autocast forward/backward agrees with float32 within bf16 tolerance; the attention
    scores and softmax stay float32; incremental decoding also runs under autocast."""
    dev = torch.device("cuda")
    cfg = PRESETS["iwslt_de_en"]().replace(dropout=0.0)
    model = model_for(cfg, src_vocab=1000, tgt_vocab=1000).to(dev)
    src, lengths, prev = (t.to(dev) for t in make_batch(B=16, S=30, T=28, src_vocab=1000,
                                                         tgt_vocab=1000))
    src[:4, :5] = PAD
    lengths = src.ne(PAD).sum(1)
    ref_logits, ref_attn = model(src, lengths, prev)
    ref_logits.float().logsumexp(-1).mean().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, attn = model(src, lengths, prev)
    assert logits.dtype == torch.bfloat16 and attn.dtype == torch.float32
    logits.float().logsumexp(-1).mean().backward()
    scale = ref_logits.abs().max()
    assert (logits.float() - ref_logits).abs().max() < 0.05 * scale
    assert (attn - ref_attn).abs().max() < 0.05
    for n, p in model.named_parameters():
        g, r = p.grad.float().flatten(), ref_grads[n].flatten()
        if r.norm() > 0:
            assert F.cosine_similarity(g, r, dim=0) > 0.98, n
    net = inference_copy(model)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        state = net.init_state(net.encode(src, lengths))
        step_logits, step_attn = net.decode_step(prev[:, 0], state)
    assert step_attn.dtype == torch.float32
    assert (step_logits.float() - ref_logits[:, 0]).abs().max() < 0.05 * scale


def test_too_long_inputs_are_refused_with_a_clear_error():
    model = model_for(TINY.replace(max_positions=8))
    src, lengths, prev = make_batch(S=9, T=4)
    with pytest.raises(ValueError, match="max_positions=8"):
        model(src, lengths, prev)
    src, lengths, prev = make_batch(S=8, T=8)
    model(src, lengths, prev)  # exactly max_positions is fine


def test_incremental_step_cost_does_not_grow_with_the_prefix():
    """Counted FLOPs of one incremental step are the same at step 1 and step 40, while the
    full-prefix recomputation grows with the prefix (§5.3)."""
    from torch.utils.flop_counter import FlopCounterMode

    net = inference_copy(model_for(MIXED))
    src, lengths, _ = make_batch(B=2)
    enc = net.encode(src, lengths)
    state = net.init_state(enc, beam_size=3)
    tokens = torch.full((6,), EOS)
    prefix = tokens[:, None]
    flops = {}
    with torch.no_grad():
        for step in range(41):
            if step in (1, 40):
                with FlopCounterMode(display=False) as inc:
                    net.decode_step(tokens, state)
                with FlopCounterMode(display=False) as full:
                    net.decode(prefix, enc, last_only=True)
                flops[step] = (inc.get_total_flops(), full.get_total_flops())
            else:
                net.decode_step(tokens, state)
            tokens = torch.randint(4, 60, (6,))
            prefix = torch.cat([prefix, tokens[:, None]], 1)
    assert flops[1][0] == flops[40][0] > 0
    assert flops[40][1] > 5 * flops[1][1]  # prefix of 41 tokens vs 2


@pytest.mark.parametrize("kernel,causal,T", [(3, True, 6), (3, False, 6), (2, False, 5),
                                             (5, True, 2), (5, False, 1), (4, False, 3)])
def test_convolution_matches_conv1d_and_its_gradient(kernel, causal, T):
    """The windowed-GEMM convolution equals F.conv1d with the same padding; the hand-written
    window backward passes gradcheck."""
    from convs2s.model.conv import Conv, _Windows

    torch.manual_seed(kernel * 10 + T)
    conv = Conv(4, 6, kernel, causal, dropout=0.0).double()
    x = torch.randn(2, T, 4, dtype=torch.double, requires_grad=True)
    left, right = conv.pad
    want = F.conv1d(F.pad(x, (0, 0, left, right)).transpose(1, 2),
                    conv.weight.transpose(1, 2), conv.bias).transpose(1, 2)
    torch.testing.assert_close(conv(x), want)
    assert torch.autograd.gradcheck(lambda x: _Windows.apply(x, kernel, left, right), (x,))


def test_the_native_convolution_trains_the_same_model_as_the_windows():
    """`use_native_conv` (TrainConfig.conv = "native") computes every convolution's full pass
    by the library's convolution: the same loss and gradients as the k-frame windows, for
    kernels 1, 2 (even: padded unevenly), 3 and 5, causal and not, with left-padded sources;
    the same parameters (a checkpoint does not know which ran), and incremental decoding,
    which never used the windows, still equals the full pass."""
    from convs2s.model.conv import use_native_conv

    model = model_for(MIXED).train()
    src, lengths, prev = make_batch(B=4, S=9, T=7)
    src[1, :3] = PAD
    lengths = src.ne(PAD).sum(1)
    target = torch.roll(prev, -1, 1)
    target[2, 4:] = PAD

    def loss_and_grads():
        model.zero_grad()
        torch.manual_seed(5)  # the same dropout masks in both runs
        loss, nll = model(src, lengths, prev, target=target, label_smoothing=0.1)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    keys = set(model.state_dict())
    want, want_grads = loss_and_grads()
    assert use_native_conv(model) == len(MIXED.encoder_layers) + len(MIXED.decoder_layers)
    got, grads = loss_and_grads()
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for n, g in grads.items():
        torch.testing.assert_close(g, want_grads[n], rtol=1e-4, atol=1e-6, msg=n)
    model.eval()
    with torch.no_grad():
        logits, _ = model(src, lengths, prev)
        net = inference_copy(model)
        state = net.init_state(net.encode(src, lengths))
        for t in range(prev.shape[1]):
            step_logits, _ = net.decode_step(prev[:, t], state)
            torch.testing.assert_close(step_logits, logits[:, t], rtol=1e-4, atol=1e-5)
    use_native_conv(model, False)
    assert not any(getattr(m, "native", False) for m in model.modules())


@pytest.mark.gpu
def test_the_native_convolution_on_a_gpu_in_bf16_matches_the_windows():
    """On CUDA under bf16 autocast (cuDNN's convolution in channels-last layout), the native
    convolution's outputs and gradients agree with the windows' within bf16 tolerance, and
    its input and output are not copied to another layout (the output is B x T x C
    contiguous, as the windows' GEMM gives it)."""
    from convs2s.model.conv import conv, use_native_conv

    dev = torch.device("cuda")
    for causal in (True, False):
        torch.manual_seed(0)
        layer = conv(256, 512, 3, causal, dropout=0.0).to(dev)
        x = torch.randn(16, 40, 256, device=dev, requires_grad=True)
        out = []
        for native in (False, True):
            use_native_conv(layer, native)
            layer.zero_grad()
            x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = layer(x)
            assert y.dtype == torch.bfloat16 and y.is_contiguous()
            y.float().square().mean().backward()
            out.append((y.float(), x.grad.clone(),
                        [p.grad.clone() for p in layer.parameters()]))
        (y0, gx0, gp0), (y1, gx1, gp1) = out
        assert (y1 - y0).abs().max() < 0.02 * y0.abs().max()
        assert F.cosine_similarity(gx1.flatten(), gx0.flatten(), dim=0) > 0.999
        for a, b in zip(gp1, gp0):
            assert F.cosine_similarity(a.flatten().float(), b.flatten().float(), dim=0) > 0.999


def test_dropout_keeps_the_expected_share_and_scale():
    from convs2s.model.layers import dropout

    torch.manual_seed(0)
    x = torch.ones(200, 1000)
    y = dropout(x, 0.2, training=True)
    assert abs(y.eq(0).float().mean().item() - 0.2) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01
    # p is used rounded to a multiple of 2**-16, with the exact scale for it
    scale = 65536 / (65536 - round(0.2 * 65536))
    assert scale == pytest.approx(1.25, rel=1e-5)
    assert torch.equal(y[y.ne(0)], torch.full_like(y[y.ne(0)], scale))
    assert dropout(x, 0.2, training=False) is x
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.2, training=True), y)  # reproducible under manual_seed
    assert not torch.equal(dropout(x, 0.2, training=True), y)  # a fresh mask each call
    odd = dropout(torch.ones(7, 3), 0.5, training=True)  # sizes not a multiple of 4
    assert odd.shape == (7, 3) and set(odd.unique().tolist()) <= {0.0, 2.0}
    # `keep` (the encoder's non-pad frames) zeroes whole frames in the same multiply
    frames = torch.ones(4, 50, 30)
    keep = torch.ones(4, 50, 1)
    keep[1, 40:] = 0
    for training in (True, False):
        y = dropout(frames, 0.2, training, keep=keep)
        assert y[1, 40:].abs().max() == 0
        assert y[:, :40].eq(0).float().mean().item() == pytest.approx(0.2 if training else 0.0,
                                                                      abs=0.02)


def test_dropout_in_bf16_keeps_the_expectation():
    """In bf16 the scale 1/(1-p) is not representable (1/0.9 rounds to 1.109375, -0.16%): the
    products are scaled instead, so that the mean of the output is the mean of the input."""
    from convs2s.model.layers import dropout

    torch.manual_seed(0)
    x = (1 + torch.rand(16_000_000)).to(torch.bfloat16)  # varied values in [1, 2)
    y = dropout(x, 0.1, training=True)
    assert y.dtype == torch.bfloat16
    # the mean's own spread here is ~1e-4 (sqrt(p / (1-p) / n), relative); the old bias 1.6e-3
    ratio = y.double().mean().item() / x.double().mean().item()
    assert abs(ratio - 1) < 5e-4, ratio
    kept = y.ne(0)
    scaled = (x[kept].double() * (65536 / (65536 - round(0.1 * 65536)))).to(torch.bfloat16)
    assert torch.equal(y[kept], scaled)  # each product rounded to nearest
    assert y.float().eq(0).float().mean().item() == pytest.approx(0.1, abs=0.001)


def test_under_bf16_autocast_attention_casts_no_keys_or_values_in_its_layers():
    # Each attention layer cast the encoder keys to float32 and autocast cast the values and the
    # length scale to bf16 again (15 layers, and their gradients back): `EncoderOut.for_attention`
    # does it once per forward. A layer now casts only its two weights and its attention weights.
    from benchmarks.step_traffic import Traffic

    torch.manual_seed(0)
    model = ConvS2S(TINY, 50, 60)
    src = torch.randint(4, 50, (3, 7))
    prev = torch.randint(4, 60, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc = model.encoder(src, torch.full((3,), 7))
        g = model.decoder.embed(prev, torch.arange(2, 7).expand(3, 5))
        h = torch.randn(3, 5, TINY.decoder_layers[0][0]).bfloat16()
        attention = model.decoder.blocks[0].attention
        # The operands as the encoder made them, first: autocast then keeps the biases' bf16
        # copies (leaf parameters) for the rest of the context, and the count below is per call.
        r = torch.randn_like(h)  # the block's residual
        before_out, before_attn = attention(h, g, enc, r)
        ready = enc.for_attention()
        out, attn = attention(h, g, ready, r)
        with Traffic() as traffic:  # counts (its matrix products are zeros, not products)
            attention(h, g, ready, r)
    casts = sum(r["calls"] for (op, _, _), r in traffic.rows.items() if op == "_to_copy")
    assert casts == 3  # in_proj's and out_proj's weight-normed weights, the attention weights
    assert ready.keys.dtype == torch.float32 and ready.values.dtype == torch.bfloat16
    assert torch.equal(out, before_out) and torch.equal(attn, before_attn)
