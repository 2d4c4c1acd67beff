"""Tests of the torch-only training pieces: collate (shard row -> padded tensors) and one
data-parallel update (convs2s.train.update), including a 2-process gloo DDP run that must match the
single-process update on the union of the batches, with uneven micro-batch counts per rank.

Run: .venv/bin/python -m pytest tests/test_train_step.py -q
"""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
from conftest import run_ranks

from convs2s.train.collate import (collate_arrow, collate_lists, pad_right, pad_to,
                                   static_shape)
from convs2s.config import EOS, PAD, PRESETS, TrainConfig
from convs2s.model.loss import sequence_loss
from convs2s.model.network import ConvS2S
from convs2s.train.optim import build_optimizer
from convs2s.train.comm import Comm
from convs2s.train.update import (autocast_for, compile_for_training, train_update,
                                  validate)

V = 40
SCHEMA = pa.schema([("id", pa.list_(pa.int64())), ("src", pa.list_(pa.list_(pa.int32()))),
                    ("tgt", pa.list_(pa.list_(pa.int32())))])


def test_collate_pads_right_and_shifts_the_target():
    b = collate_lists([[5, 6, 7, EOS], [8, EOS]], [[9, EOS], [10, 11, 12, EOS]], ids=[3, 4])
    assert b.src_tokens.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert b.src_lengths.tolist() == [4, 2]
    assert b.target.tolist() == [[9, EOS, PAD, PAD], [10, 11, 12, EOS]]
    assert b.prev_output_tokens.tolist() == [[EOS, 9, PAD, PAD], [EOS, 10, 11, 12]]
    assert (b.ntokens, b.src_ntokens, b.padded_tokens, b.nsentences) == (6, 6, 16, 2)
    assert b.src_tokens.dtype == torch.int64 and b.ids.tolist() == [3, 4]


def test_collate_arrow_reads_one_row_of_a_sliced_table():
    rows = [{"id": [0, 1], "src": [[4, EOS], [5, 6, EOS]], "tgt": [[7, EOS], [8, EOS]]},
            {"id": [2], "src": [[9, 9, 9, EOS]], "tgt": [[10, 11, EOS]]}]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    b = collate_arrow(table.slice(1, 1))
    assert b.src_tokens.tolist() == [[9, 9, 9, EOS]]
    assert b.prev_output_tokens.tolist() == [[EOS, 10, 11]] and b.ids.tolist() == [2]
    with pytest.raises(ValueError, match="one batch row"):
        collate_arrow(table)


def test_collate_rejects_broken_rows_with_ids_and_fix():
    with pytest.raises(ValueError, match=r"ids \[7\].*does not end with EOS.*re-run preprocessing"):
        collate_lists([[4, EOS]], [[5, 6]], ids=[7])
    with pytest.raises(ValueError, match="empty sentence"):
        collate_lists([[4, EOS]], [[]])
    bad = pa.table({"src": [[[4, EOS]]]})
    with pytest.raises(ValueError, match=r"lacks columns \['tgt'\]"):
        collate_arrow(bad)


def test_pad_right_matches_a_python_loop():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (17,), generator=g).numpy()
    flat = torch.randint(4, 99, (int(lengths.sum()),), generator=g).numpy()
    out = pad_right(flat, lengths)
    start = 0
    for i, n in enumerate(lengths):
        assert out[i, :n].tolist() == flat[start:start + n].tolist()
        assert (out[i, n:] == PAD).all()
        start += n


def make_batches(seed: int, n: int):
    """n random batches of different sizes and lengths (different token counts)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        bsz = int(torch.randint(2, 6, (1,), generator=g))
        src = [torch.randint(4, V, (int(torch.randint(2, 9, (1,), generator=g)),),
                             generator=g).tolist() + [EOS] for _ in range(bsz)]
        tgt = [torch.randint(4, V, (int(torch.randint(2, 9, (1,), generator=g)),),
                             generator=g).tolist() + [EOS] for _ in range(bsz)]
        out.append(collate_lists(src, tgt))
    return out


# float32: these tests compare updates to rounding (bf16 has its own tests, test_precision.py)
CFG = TrainConfig(lr=0.25, clip_norm=0.1, label_smoothing=0.1, precision="fp32")


def fresh_model():
    torch.manual_seed(1)
    return ConvS2S(PRESETS["tiny"](), V, V)


def single_process_update(batches):
    model = fresh_model()
    opt = build_optimizer(model.parameters(), CFG)
    stats = train_update(model, opt, batches, CFG, Comm(), torch.device("cpu"))
    return model, stats


def _ddp_worker(rank: int, port: int, result: dict):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    batches = make_batches(0, 3)
    mine = batches[:2] if rank == 0 else batches[2:]  # uneven: 2 micro-batches vs 1
    model = torch.nn.parallel.DistributedDataParallel(fresh_model())
    opt = build_optimizer(model.parameters(), CFG)
    comm = Comm.create()
    loss, nll, ntok = validate(model.module, mine, comm, torch.device("cpu"), CFG)
    stats = train_update(model, opt, mine, CFG, comm, torch.device("cpu"))
    stop = train_update(model, opt, [] if rank == 1 else mine, CFG, comm, torch.device("cpu"))
    if rank == 0:
        result["params"] = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        result["ntokens"] = stats.ntokens
        result["grad_norm"] = float(stats.grad_norm)  # before clipping: a gradient off by a
        # factor, which clipping to 0.1 hides in the weights, shows here
        result["valid"] = (loss, nll, ntok)
        result["stop"] = stop
    dist.destroy_process_group()


def test_two_process_ddp_update_equals_single_process_update_on_the_union():
    result = run_ranks(_ddp_worker, 2)
    batches = make_batches(0, 3)
    ref, stats = single_process_update(batches)
    assert result["ntokens"] == stats.ntokens == sum(b.ntokens for b in batches)
    assert result["grad_norm"] == pytest.approx(float(stats.grad_norm), rel=1e-5)
    assert result["stop"] is None  # a rank without data ends the epoch on every rank
    ref_params = ref.state_dict()
    init = fresh_model().state_dict()
    for k, v in result["params"].items():
        assert torch.allclose(v, ref_params[k], rtol=1e-5, atol=1e-7), k
    moved = max(float((ref_params[k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-4  # the update is far larger than the tolerance
    # Normalizing per rank instead (mean of the two ranks' per-token losses) would differ:
    wrong = fresh_model()
    opt = build_optimizer(wrong.parameters(), CFG)
    for part in (batches[:2], batches[2:]):
        n = sum(b.ntokens for b in part)
        for b in part:
            logits, _ = wrong(b.src_tokens, b.src_lengths, b.prev_output_tokens)
            (sequence_loss(logits, b.target, CFG.label_smoothing)[0] / n / 2).backward()
    torch.nn.utils.clip_grad_norm_(wrong.parameters(), CFG.clip_norm)
    opt.step()
    assert any(not torch.allclose(result["params"][k], v, rtol=1e-5, atol=1e-7)
               for k, v in wrong.state_dict().items())
    # Validation sums over both ranks (taken before the update) equal the single-process sums.
    loss, nll, ntok = validate(fresh_model(), batches, Comm(), torch.device("cpu"), CFG)
    assert result["valid"][2] == ntok
    assert result["valid"][0] == pytest.approx(loss, rel=1e-5)
    assert result["valid"][1] == pytest.approx(nll, rel=1e-5)


def _compressed_worker(rank: int, port: int, result: dict):
    """One update of two ranks whose DDP all-reduces bf16 gradients in 1 MiB buckets, as the
    Trainer wraps its model (`convs2s.train.ddp`)."""
    from convs2s.train.ddp import compress_gradients, ddp_kwargs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    # unclipped, so that a gradient off by a factor shows in the update
    cfg = CFG.replace(clip_norm=0.0, ddp_bucket_mb=1.0, grad_compression="bf16")
    batches = make_batches(0, 3)
    mine = batches[:2] if rank == 0 else batches[2:]
    model = compress_gradients(
        torch.nn.parallel.DistributedDataParallel(fresh_model(), **ddp_kwargs(cfg)),
        cfg.grad_compression)
    opt = build_optimizer(model.parameters(), cfg)
    train_update(model, opt, mine, cfg, Comm.create(), torch.device("cpu"))
    if rank == 0:
        result["params"] = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    dist.destroy_process_group()


def test_bf16_gradient_compression_trains_the_float32_update_within_bf16_rounding():
    """`grad_compression="bf16"` halves the bytes of DDP's all-reduce: the update is the
    single-process one within bf16 rounding of the gradients, and not bit for bit (the
    gradients did travel as bf16)."""
    result = run_ranks(_compressed_worker, 2)
    ref = fresh_model()
    cfg = CFG.replace(clip_norm=0.0)
    train_update(ref, build_optimizer(ref.parameters(), cfg), make_batches(0, 3), cfg, Comm(),
                 torch.device("cpu"))
    init = fresh_model().state_dict()
    exact = True
    for k, v in ref.state_dict().items():
        step, got = v - init[k], result["params"][k] - init[k]
        # each weight's step within 2% of the largest step of its tensor (bf16: 8 bits)
        assert float((got - step).abs().max()) <= 0.02 * float(step.abs().max()) + 1e-9, k
        exact &= torch.allclose(result["params"][k], v, rtol=1e-6, atol=1e-9)
    assert not exact
    with pytest.raises(ValueError, match="grad_compression must be"):
        CFG.replace(grad_compression="fp8")


def test_gradient_accumulation_equals_one_big_batch():
    batches = make_batches(5, 2)
    accumulated, _ = single_process_update(batches)
    src = [row[row != PAD].tolist() for b in batches for row in b.src_tokens]
    tgt = [row[row != PAD].tolist() for b in batches for row in b.target]
    merged, _ = single_process_update([collate_lists(src, tgt)])
    for k, v in merged.state_dict().items():
        assert torch.allclose(v, accumulated.state_dict()[k], rtol=1e-5, atol=1e-7), k


def test_loss_falls_on_a_repeated_batch():
    batches = make_batches(2, 2)
    model = fresh_model()
    cfg = TrainConfig(lr=0.25)
    opt = build_optimizer(model.parameters(), cfg)
    losses = []
    for _ in range(30):
        s = train_update(model, opt, batches, cfg, Comm(), torch.device("cpu"))
        losses.append(float(s.loss_sum) / s.ntokens)
    assert losses[-1] < 0.5 * losses[0]


def test_meter_reports_per_token_means_and_excludes_paused_time():
    from convs2s.train.meter import TrainMeter, format_eta, progress_line

    batches = make_batches(3, 2)
    model = fresh_model()
    opt = build_optimizer(model.parameters(), CFG)
    meter = TrainMeter(Comm(), torch.device("cpu"))
    total_loss, total_tokens = 0.0, 0
    for _ in range(3):
        s = train_update(model, opt, batches, CFG, Comm(), torch.device("cpu"))
        meter.add(s, batches)
        total_loss += float(s.loss_sum)
        total_tokens += s.ntokens
    meter.pause()
    m = meter.read(lr=0.25)
    assert m["train/loss"] == pytest.approx(total_loss / total_tokens, rel=1e-5)
    assert m["train/ppl"] == pytest.approx(2.718281828 ** m["train/nll"], rel=1e-4)
    assert 0 < m["train/padding_efficiency"] <= 1 and m["train/peak_mem_mb"] > 0
    assert m["train/tokens_per_s"] == pytest.approx(m["train/updates_per_s"] * total_tokens / 3)
    assert meter.updates == 0 and meter.tokens == 0  # reset after reading
    line = progress_line(2, 30, m, eta_s=3725)
    assert "epoch 2 | update 30" in line and "tok/s" in line and "ETA epoch 1:02:05" in line
    assert format_eta(float("inf")) == "?"


def test_batches_padded_to_static_shapes_train_the_same_updates():
    """A step captured once per shape (CUDA graphs) trains batches padded to a few fixed
    shapes (`static_shape`, `pad_to`): appended dummy sentences and wider padding leave the
    losses and the trained weights those of the unpadded batches, and the counts (tokens,
    sentences) the batch's own."""
    batches = make_batches(3, 4)
    shapes = [static_shape(b, max_tokens=48, multiple=8) for b in batches]
    padded = [pad_to(b, *shape) for b, shape in zip(batches, shapes)]
    for b, p, (n, s, t) in zip(batches, padded, shapes):
        assert p.src_tokens.shape == (n, s) and p.target.shape == (n, t)
        assert n >= b.nsentences and s % 8 == 0 and t % 8 == 0
        assert (p.nsentences, p.ntokens, p.pad_rows) == (b.nsentences, b.ntokens,
                                                          n - b.nsentences)
        assert p.target_rows.dtype == torch.bool and int(p.target_rows.sum()) == b.ntokens
        assert (p.src_lengths[b.nsentences:] == 1).all()
    assert len(set(shapes)) < len({(b.src_tokens.shape, b.target.shape) for b in batches})
    runs = []
    for seq in (batches, padded):
        model = fresh_model()
        opt = build_optimizer(model.parameters(), CFG)
        losses = [float(train_update(model, opt, [b], CFG, Comm(), torch.device("cpu"))
                        .loss_sum) for b in seq]
        runs.append((losses, model.state_dict()))
    assert runs[1][0] == pytest.approx(runs[0][0], rel=1e-5)
    for (k, a), b in zip(runs[0][1].items(), runs[1][1].values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)
    with pytest.raises(ValueError, match="cannot hold"):
        pad_to(batches[0], batches[0].nsentences - 1, 64, 64)


def test_static_shapes_round_lengths_and_sentence_counts_to_few_values():
    """Lengths round up to the multiple; sentence counts to a ladder growing by a quarter,
    capped at what a batch of the budget (n * max(S, T) <= max_tokens) can hold at the
    bucket's shortest lengths; a batch over the budget (one long sentence) keeps its count."""
    def batch(n, s, t):
        return collate_lists([[5] * (s - 1) + [EOS]] * n, [[6] * (t - 1) + [EOS]] * n)

    budget = 120
    counts, shapes = set(), set()
    for s in range(9, 17):
        for t in range(9, 17):
            n = budget // max(s, t)  # 7, 8, 9, 10, 12 or 13 sentences
            shape = static_shape(batch(n, s, t), budget, multiple=8)
            assert shape[1:] == (16, 16) and n <= shape[0] <= min(budget // 9, 1.25 * n + 1)
            counts.add(n)
            shapes.add(shape)
    assert len(counts) == 6 and sorted(n for n, _, _ in shapes) == [8, 10, 12, 13]
    assert static_shape(batch(1, 150, 7), budget, multiple=8) == (1, 152, 8)
    # the model's max_positions caps a rounded length, never below the batch's own
    assert static_shape(batch(1, 150, 7), budget, multiple=8, max_len=150) == (1, 150, 8)
    assert static_shape(batch(1, 150, 7), budget, multiple=8, max_len=100) == (1, 150, 8)


@pytest.mark.gpu
def test_bf16_update_on_cuda_tracks_the_float32_update():
    device = torch.device("cuda")
    batches = make_batches(4, 2)
    losses = {}
    for bf16 in (False, True):
        cfg = CFG.replace(precision="bf16" if bf16 else "fp32")
        model = fresh_model().to(device)
        opt = build_optimizer(model.parameters(), cfg)
        stats = train_update(model, opt, batches, cfg, Comm(), device)
        losses[bf16] = float(stats.loss_sum) / stats.ntokens
        assert torch.isfinite(stats.grad_norm)
        assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)


def _nccl_worker(rank: int, port: int, result: dict):
    """One rank of an nccl world on GPU 0: DDP's bucketed all-reduce runs through nccl and the
    host counts through Comm's gloo side group, as on a Ray Train GPU worker."""
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    comm = Comm.create()
    result["backend"] = (dist.get_backend(), dist.get_backend(comm.cpu_group))
    batches = [b.to(device) for b in make_batches(0, 3)]
    model = torch.nn.parallel.DistributedDataParallel(fresh_model().to(device),
                                                      device_ids=[0])
    opt = build_optimizer(model.parameters(), CFG)
    stats = train_update(model, opt, batches, CFG, comm, device)
    result["fp32_params"] = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
    result["ntokens"] = stats.ntokens
    bf16 = CFG.replace(precision="bf16")
    model = torch.nn.parallel.DistributedDataParallel(fresh_model().to(device), device_ids=[0])
    opt = build_optimizer(model.parameters(), bf16)
    losses = []
    for _ in range(12):
        s = train_update(model, opt, batches, bf16, comm, device)
        losses.append(float(s.loss_sum) / s.ntokens)
        assert torch.isfinite(s.grad_norm)
    result["bf16_losses"] = losses
    result["bf16_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_ddp_update_on_one_gpu_equals_the_plain_update_and_bf16_trains():
    """The training update as a Ray Train GPU worker runs it (DDP over nccl, host counts over
    gloo) equals the plain float32 update on the same GPU; bf16 autocast updates lower the loss
    with float32 master weights."""
    result = run_ranks(_nccl_worker, 1)
    assert result["backend"] == ("nccl", "gloo")
    device = torch.device("cuda")
    batches = [b.to(device) for b in make_batches(0, 3)]
    ref = fresh_model().to(device)
    opt = build_optimizer(ref.parameters(), CFG)
    stats = train_update(ref, opt, batches, CFG, Comm(), device)
    assert result["ntokens"] == stats.ntokens
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(result["fp32_params"][k], v.cpu(), rtol=1e-4, atol=1e-6,
                                   msg=k)
    losses = result["bf16_losses"]
    assert losses[-1] < losses[0] - 0.1, losses  # H200: even lr 0.05 lowered it by 0.13
    assert result["bf16_dtypes"] == ["torch.float32"]


class _HostWaits:
    """Counts the operations that make the host wait for the device on a GPU: reading a value
    (`.item()`, `float()`, `bool()`, `.tolist()`), `nonzero` and what is built on it (a
    boolean-mask index, `masked_select`, `unique`, a tensor of repeats) and copies to the host.
    On the CPU nothing waits, but the operations are the same: counted here, they are what a
    GPU step would wait for (the `gpu` test below checks with CUDA's own sync debug mode)."""

    SYNCS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default",
             "aten.nonzero.default", "aten.argwhere.default", "aten.masked_select.default",
             "aten.repeat_interleave.Tensor", "aten._unique2.default",
             "aten.unique_dim.default", "aten.unique_consecutive.default"}
    HOST = ("tolist", "cpu", "numpy", "item", "__bool__", "__int__", "__float__")

    def __init__(self):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        self.seen: list[str] = []
        owner = self

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if name in owner.SYNCS or (name.startswith(("aten.index.Tensor", "aten.index_put"))
                                           and any(getattr(i, "dtype", None) == torch.bool
                                                   for i in args[1] if i is not None)):
                    owner.seen.append(name)
                return func(*args, **(kwargs or {}))

        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in owner.HOST:
                    owner.seen.append(func.__name__)
                return func(*args, **(kwargs or {}))

        self._modes = (Function(), Dispatch())

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_update_of_two_micro_batches_makes_the_host_wait_for_nothing(precision):
    """Issue 37: no host sync inside a step, counted (on the CPU, the operations that would
    wait on a GPU: `_HostWaits`). An update of two accumulated micro-batches (forward through
    the fused loss, backward, the gradients' norm and clipping, the optimizer step, the
    update's statistics) makes none; the counter itself sees each kind it counts."""
    cfg = CFG.replace(precision=precision, update_freq=2)
    model = fresh_model()
    opt = build_optimizer(model.parameters(), cfg)
    first, second = make_batches(11, 2), make_batches(12, 2)
    train_update(model, opt, first, cfg, Comm(), torch.device("cpu"))  # (the optimizer's state)
    with _HostWaits() as waits:
        stats = train_update(model, opt, second, cfg, Comm(), torch.device("cpu"))
    assert waits.seen == [], waits.seen
    assert stats.ntokens == sum(b.ntokens for b in second)  # (known on the host, from the data)
    with _HostWaits() as control:
        x = torch.randn(5)
        float(x.sum()), x[x > 0], x.nonzero(), x.tolist()
    assert len(control.seen) >= 4, control.seen


@pytest.mark.gpu
@pytest.mark.parametrize("static", [False, True], ids=["rows", "static-shape"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_forward_and_backward_of_a_step_never_wait_for_the_gpu(precision, static):
    """CUDA's sync debug mode raises on any operation that makes the host wait for the device:
    the model's forward through the fused loss and its backward make none (the non-pad rows
    come from the collate, `Batch.target_rows`; padded to a static shape, a mask), so the
    host can queue the next kernels."""
    device = torch.device("cuda")
    cfg = CFG.replace(precision=precision)
    model = fresh_model().to(device)
    batch = make_batches(4, 1)[0]
    if static:
        batch = pad_to(batch, *static_shape(batch, max_tokens=64))
    batch = batch.to(device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with autocast_for(device, cfg):
            loss, _ = model(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens,
                            target=batch.target, label_smoothing=0.1,
                            target_rows=batch.target_rows)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


def test_cuda_graphs_refuse_a_model_off_the_gpu():
    from convs2s.train.graphs import CudaGraphedLoss

    with pytest.raises(ValueError, match="CUDA device, it is on cpu"):
        CudaGraphedLoss(fresh_model())


@pytest.mark.gpu
@pytest.mark.parametrize("precision,fuse", [("fp32", ""), ("bf16", ""), ("bf16", "inductor")],
                         ids=["fp32", "bf16", "bf16-fused"])
def test_cuda_graphed_updates_equal_the_eager_updates(precision, fuse, compile_state):
    """The forward and backward replayed from one CUDA graph per static shape train the same
    updates as the eager step on the same padded batches (no dropout: the masks would differ),
    capture once per shape (several shapes, one memory pool), add the gradients of two
    different micro-batches of one shape (not the second replay's alone), validate eagerly, and
    with dropout draw fresh masks each replay. With the blocks' element-wise work and the
    loss's chunks compiled (TrainConfig.fuse, as the Trainer sets it), their Triton kernels are
    captured too: the same updates."""
    from convs2s.model.fused import fuse_regions
    from convs2s.model.loss import compile_loss_chunks
    from convs2s.train.graphs import CudaGraphedLoss
    from convs2s.train.regularization import set_dropout

    device = torch.device("cuda")
    cfg = CFG.replace(precision=precision)
    raw = make_batches(5, 3)
    batches = [pad_to(b, *static_shape(b, max_tokens=48, multiple=8)) for b in raw]
    shapes = {(b.src_tokens.shape, b.target.shape) for b in batches}
    assert len(shapes) >= 2
    common = (max(b.src_tokens.shape[0] for b in raw), max(b.src_tokens.shape[1] for b in raw),
              max(b.target.shape[1] for b in raw))
    # shapes seen again: replays, no new capture; the last update: two different batches
    # padded to one shape, in one update
    updates = [[b] for b in batches + batches[:2]] + [[pad_to(raw[0], *common),
                                                       pad_to(raw[1], *common)]]
    runs = []
    for graphed in (False, True):
        net = fresh_model().to(device)
        if graphed:
            fuse_regions(net, fuse)
        compile_loss_chunks(fuse if graphed else None)
        stepped = CudaGraphedLoss(net) if graphed else net
        opt = build_optimizer(net.parameters(), cfg)
        losses = [float(train_update(stepped, opt, mbs, cfg, Comm(), device).loss_sum)
                  for mbs in updates]
        runs.append((losses, net.state_dict(), validate(stepped, batches[:2], Comm(), device,
                                                        cfg)))
        if graphed:
            assert stepped.captured_shapes == len(shapes) + 1
    (eager, eager_state, eager_val), (replayed, state, val) = runs
    rel = 1e-4 if precision == "fp32" else 1e-3
    assert replayed == pytest.approx(eager, rel=rel)
    assert val == pytest.approx(eager_val, rel=rel)
    for k, a in eager_state.items():
        torch.testing.assert_close(state[k], a, rtol=rel, atol=rel * 1e-2, msg=k)

    net = fresh_model().to(device)
    set_dropout(net, 0.2)
    fuse_regions(net, fuse)
    graphed = CudaGraphedLoss(net)

    def loss_of(b):
        b = b.to(device)
        with autocast_for(device, cfg):
            return graphed(b.src_tokens, b.src_lengths, b.prev_output_tokens, target=b.target,
                           label_smoothing=0.1, target_rows=b.target_rows)[0]

    losses = []
    for _ in range(2):  # each replay's backward before the next forward
        loss = loss_of(batches[0])
        losses.append(float(loss))
        loss.backward()
    assert losses[0] != losses[1] and all(math.isfinite(v) for v in losses)
    # a forward before the last one's backward, of another shape (the graphs share memory)
    # or of the same (its replay would overwrite what the backward reads): refused
    pending = loss_of(batches[0])
    for b in (batches[1], batches[0]):
        with pytest.raises(RuntimeError, match="before the backward"):
            loss_of(b)
    pending.backward()
    loss_of(batches[1]).backward()  # once the backward ran, the next forward goes on


@pytest.mark.gpu
def test_cuda_graphs_past_their_cap_step_eagerly_and_a_new_dropout_recaptures():
    """`max_shapes` bounds the captures (each keeps a step's memory): a shape past it steps
    eagerly, and the updates are still the eager ones; a new dropout rate drops the captures
    made with the old one."""
    from convs2s.train.graphs import CudaGraphedLoss
    from convs2s.train.regularization import set_dropout

    device = torch.device("cuda")
    raw = make_batches(5, 3)
    batches = [pad_to(b, *static_shape(b, max_tokens=48, multiple=8)) for b in raw]
    assert len({(b.src_tokens.shape, b.target.shape) for b in batches}) >= 2
    runs = []
    for graphed in (False, True):
        net = fresh_model().to(device)
        stepped = CudaGraphedLoss(net, max_shapes=1) if graphed else net
        opt = build_optimizer(net.parameters(), CFG)
        runs.append(([float(train_update(stepped, opt, [b], CFG, Comm(), device).loss_sum)
                      for b in batches], {k: v.clone() for k, v in net.state_dict().items()}))
        if graphed:
            assert stepped.captured_shapes == 1 and stepped.eager_steps >= 1
            import weakref

            old = [weakref.ref(c) for c in stepped._graphed.values()]
            set_dropout(net, 0.1)
            train_update(stepped, opt, [batches[-1]], CFG, Comm(), device)
            assert stepped.captured_shapes == 1  # the rate's own capture, the old one dropped
            # and freed (each capture is a reference cycle: held until a collection)
            assert all(r() is None for r in old)
    (eager, eager_state), (mixed, state) = runs
    assert mixed == pytest.approx(eager, rel=1e-4)
    for k, a in eager_state.items():
        torch.testing.assert_close(state[k], a, rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.gpu
def test_a_capture_draws_no_dropout_masks_so_a_resumed_run_draws_the_same_ones():
    """A shape's first graphed step captures it, with warm-up passes in training mode whose
    dropout would move the CUDA generator; a run resumed from a checkpoint captures its shapes
    at other updates than the run that went on, so its masks would differ from there. A
    capturing step draws the masks a replay from the same generator state draws, and leaves
    the generator where that replay leaves it."""
    from convs2s.train.graphs import CudaGraphedLoss
    from convs2s.train.regularization import set_dropout

    device = torch.device("cuda")
    net = fresh_model().to(device)
    set_dropout(net, 0.2)
    graphed = CudaGraphedLoss(net)
    raw = make_batches(5, 1)[0]
    b = pad_to(raw, *static_shape(raw, max_tokens=48, multiple=8)).to(device)

    def step() -> float:  # forward and backward; no optimizer step: the weights stay
        loss = graphed(b.src_tokens, b.src_lengths, b.prev_output_tokens, target=b.target,
                       label_smoothing=0.1, target_rows=b.target_rows)[0]
        loss.backward()
        return float(loss)

    before = torch.cuda.get_rng_state(device)
    captured = step()  # the capture, then its first replay
    after = torch.cuda.get_rng_state(device)
    torch.cuda.set_rng_state(before, device)
    assert step() == pytest.approx(captured, rel=1e-6)  # a replay alone: the same masks
    assert torch.equal(torch.cuda.get_rng_state(device), after)


def test_a_compiled_update_equals_the_eager_update(compile_state):
    """`TrainConfig.compile`: the model through the fused loss captured as one graph with
    dynamic shapes (fullgraph: no break, one capture for batches of every shape) trains the
    same updates as eager, losses and weights within float32 tolerance. The `aot_eager`
    backend checks the capture in seconds (Inductor adds code generation, not semantics)."""
    cfg = CFG.replace(compile="aot_eager")
    batches = make_batches(7, 4)  # four shapes
    from convs2s.train.regularization import set_dropout

    eager, compiled_net = fresh_model(), fresh_model()  # the same weights
    for net in (eager, compiled_net):
        set_dropout(net, 0.0)  # no random masks: the two runs must match
    compiled = compile_for_training(compiled_net, cfg.compile, fullgraph=True)  # as the Trainer
    runs = {}
    for name, model, net in (("eager", eager, eager), ("compiled", compiled, compiled_net)):
        opt = build_optimizer(net.parameters(), cfg)
        runs[name] = []
        for i, b in enumerate(batches):
            # after the first capture, a batch of another shape that would need a second one
            # (a size fixed in the graph) is an error, not a silent recompile
            with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
                stats = train_update(model, opt, [b], cfg, Comm(), torch.device("cpu"))
            # the loss, and the gradients' norm before clipping (clipped to 0.1, a gradient
            # off by a constant factor would leave the same weights)
            runs[name] += [float(stats.loss_sum), float(stats.grad_norm)]
    assert runs["compiled"] == pytest.approx(runs["eager"], rel=1e-5)
    for (k, a), b in zip(eager.state_dict().items(), compiled_net.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)


def test_a_first_batch_whose_source_and_target_are_as_long_does_not_fix_them_equal(
        compile_state):
    """torch's duck sizing gave sizes equal at the first call one symbol: after a first batch
    whose source and target were as long (the rule with static shapes, and the memory probe's
    first steps), the next whose were not compiled the whole model again (minutes on a GPU).
    The compiled model's graph and the fused regions' serve both; a batch of one sentence is
    the one shape that compiles once more (torch specializes sizes 0 and 1)."""
    from convs2s.model.fused import compiled_regions

    def batch(b: int, s: int, t: int):
        g = torch.Generator().manual_seed(b * 100 + s * 10 + t)
        return collate_lists(
            [torch.randint(4, V, (s - 1,), generator=g).tolist() + [EOS] for _ in range(b)],
            [torch.randint(4, V, (t - 1,), generator=g).tolist() + [EOS] for _ in range(b)])

    cfg = CFG.replace(compile="aot_eager")
    net = fresh_model()
    model = compile_for_training(net, cfg.compile, fullgraph=True)
    opt = build_optimizer(net.parameters(), cfg)
    for i, shape in enumerate([(4, 8, 8), (4, 8, 12), (3, 10, 6), (5, 6, 6)]):
        with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
            train_update(model, opt, [batch(*shape)], cfg, Comm(), torch.device("cpu"))
    from convs2s.model import fused as fused_module

    regions = compiled_regions("aot_eager")
    fused = fresh_model()
    holders = [m for m in fused.modules() if hasattr(m, "fused")]
    assert holders  # (else the loop below runs the eager model and the check is empty)
    for m in holders:
        m.fused = regions
    try:
        for i, shape in enumerate([(4, 8, 8), (4, 8, 12), (3, 10, 6)]):
            b = batch(*shape)
            with torch.compiler.set_stance("fail_on_recompile" if i else "default"):
                fused(b.src_tokens, b.src_lengths, b.prev_output_tokens)
    finally:  # (the regions' compiled code is process-wide: tests/test_fused.py counts it)
        fused_module._compiled.pop("aot_eager", None)
        torch._dynamo.reset()


def test_a_compiled_update_with_dropout_is_still_one_graph(compile_state):
    """Dropout on the CPU draws its masks with an eager-only trick (`random_` on a buffer);
    under torch.compile it takes `F.dropout`, so the graph does not break at each of the
    model's dropouts (fullgraph raises on a break) and the masks still drop: the forward and
    backward of the same weights on the same batch differ only by their masks."""
    cfg = CFG.replace(compile="aot_eager")
    batch = make_batches(7, 1)[0]
    from convs2s.train.regularization import set_dropout

    net = fresh_model()
    set_dropout(net, 0.2)  # the tiny preset has none
    compiled = compile_for_training(net, cfg.compile, fullgraph=True)
    net.train()
    losses, grads = [], []
    for _ in range(2):
        net.zero_grad()
        loss, _ = compiled(batch.src_tokens, batch.src_lengths, batch.prev_output_tokens,
                           target=batch.target, label_smoothing=0.1,
                           target_rows=batch.target_rows)
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()
                                if p.grad is not None]))
    assert losses[0] != losses[1]  # fresh masks each call
    assert all(math.isfinite(v) for v in losses)
    assert all(torch.isfinite(g).all() for g in grads) and not torch.equal(*grads)
