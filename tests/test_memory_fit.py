"""A token budget the GPU cannot hold fails before training, naming the largest that fits
(convs2s/train/memory_fit.py): the data's largest step is the budget filled with its longest
sentences, probed once on the rank's GPU."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_ranks

from convs2s.config import EOS, PAD, PRESETS
from convs2s.model.network import ConvS2S
from convs2s.precision import Precision
from convs2s.train.collate import collate_lists, static_shape
from convs2s.train.memory_fit import (HEADROOM, MIN_LENGTH, STEP, BudgetTooLarge, WorstStep,
                                      agree_on_fit, check_fits, largest_fitting, probe_batches)


def test_the_worst_batch_fills_the_budget_on_both_sides_with_the_longest_it_can():
    worst = WorstStep(max_tokens=3000, longest_src=120, longest_tgt=140)
    # 25 pairs of 120 x 120 fill the budget on both sides (3,000 tokens each) with attention
    # 25 x 120 x 120: no batch the budget allows has more tokens on a side or more attention
    assert worst.shape() == (25, 120, 120)
    [batch] = probe_batches(worst, src_vocab=300, tgt_vocab=500)
    assert batch.src_tokens.shape == (25, 120) and batch.target.shape == (25, 120)
    assert int(batch.src_tokens.max()) < 300 and int(batch.target.max()) < 500
    assert (batch.target[:, -1] == EOS).all() and not (batch.target == PAD).any()
    assert batch.ntokens == 25 * 120 and len(batch.target_rows) == 25 * 120
    # under a smaller budget, sentences longer than it would not be in any batch
    assert worst.shape(1000) == (8, 120, 120) and worst.shape(100) == (1, 100, 100)


@pytest.mark.parametrize("max_sentences", [None, 9])
def test_with_static_shapes_the_probe_steps_the_largest_padded_batches(max_sentences):
    """Training pads each batch to a static shape and its masked loss computes every row, so
    the probe runs padded batches: the largest in token slots and in attention of every
    shape the budget allows (with at most the batches' cap of pairs, preprocessing's
    max_sentences), found here by padding each allowed batch as training does."""
    worst = WorstStep(max_tokens=120, longest_src=20, longest_tgt=26, max_sentences=max_sentences)
    stepped = set()  # (sentences, S, T) of every batch of the budget, padded
    for s in range(MIN_LENGTH, 21):
        for t in range(MIN_LENGTH, 27):
            for n in range(1, min(120 // max(s, t), max_sentences or 120) + 1):
                batch = collate_lists([[5] * (s - 1) + [EOS]] * n, [[6] * (t - 1) + [EOS]] * n)
                stepped.add(static_shape(batch, 120, multiple=8, max_len=24))

    def slots(shape):
        return shape[0] * (shape[1] + shape[2])

    def attention(shape):
        return shape[0] * shape[1] * shape[2]

    probed = probe_batches(worst, 300, 500, static_shapes=8, max_len=24)
    shapes = [(b.src_tokens.shape[0], b.src_tokens.shape[1], b.target.shape[1]) for b in probed]
    assert set(shapes) <= stepped  # each a shape training steps
    assert max(map(slots, shapes)) == max(map(slots, stepped))
    assert max(map(attention, shapes)) == max(map(attention, stepped))
    # the padded worst is larger than the unpadded one the probe ran before (n x 20 x 26)
    assert max(map(slots, shapes)) > 2 * 120 and max(map(attention, shapes)) > 4 * 20 * 26
    for b in probed:  # as training steps it: the target rows a mask over every row
        assert b.target_rows.dtype == torch.bool and b.target_rows.numel() == b.target.numel()
        assert b.pad_rows == b.src_tokens.shape[0] - b.nsentences
        assert int(b.target_rows.sum()) == b.ntokens
    # without static shapes: the one unpadded worst batch, as before
    [plain] = probe_batches(worst, 300, 500)
    assert plain.src_tokens.shape == (6, 20) and plain.target.shape == (6, 20)


def test_the_worst_step_comes_from_the_manifest_preprocessing_wrote(tmp_path):
    folder = tmp_path / "batches" / "train"
    folder.mkdir(parents=True)
    assert WorstStep.of_data(folder, max_positions=1024) is None  # no manifest
    (folder / "manifest.json").write_text(json.dumps({"max_tokens": 4000}))
    assert WorstStep.of_data(folder, max_positions=1024) is None  # cut before `longest`
    (folder / "manifest.json").write_text(json.dumps(
        {"max_tokens": 4000, "longest": {"src": 300, "tgt": 90}}))
    assert WorstStep.of_data(folder, max_positions=256) == WorstStep(4000, 256, 90)
    (folder / "manifest.json").write_text(json.dumps(
        {"max_tokens": 4000, "max_sentences": 64, "longest": {"src": 300, "tgt": 90}}))
    worst = WorstStep.of_data(folder, max_positions=256)
    assert worst == WorstStep(4000, 256, 90, max_sentences=64)
    assert worst.shape(4000) == (44, 90, 90) and WorstStep(4000, 50, 50, 64).shape() == \
        (64, 50, 50)  # a batch never holds more pairs than the cap


def test_the_largest_fitting_budget_is_found_by_bisection():
    asked = []

    def fits(budget: int) -> bool:
        asked.append(budget)
        return budget <= 7300

    assert largest_fitting(fits, below=24000) == 7000
    assert len(asked) <= 6 and all(b % STEP == 0 and b < 24000 for b in asked)
    assert largest_fitting(lambda b: False, below=24000) == 0
    assert largest_fitting(lambda b: True, below=24000) == 23500


def test_cuda_graphs_capture_as_many_shapes_as_the_memory_left_holds():
    """Each capture keeps about what the worst step holds beyond the weights; the cap and at
    least one capture bound the count."""
    from convs2s.train.memory_fit import graph_shapes_that_fit

    gib = 2**30
    # weights 1, worst step 4 (3 beyond the weights), update 2: 20 usable leaves 14, 4 more
    assert graph_shapes_that_fit(4 * gib, 1 * gib, 2 * gib, 20 * gib, cap=16) == 5
    assert graph_shapes_that_fit(4 * gib, 1 * gib, 2 * gib, 200 * gib, cap=16) == 16
    assert graph_shapes_that_fit(4 * gib, 1 * gib, 2 * gib, 5 * gib, cap=16) == 1


def test_the_cpu_is_not_checked():
    net = ConvS2S(PRESETS["tiny"](), 100, 100)
    worst = WorstStep(10**9, 1024, 1024)  # would never fit anywhere
    assert check_fits(net, worst, Precision("fp32", "test"), torch.device("cpu"), 0.1) is None


@pytest.mark.gpu
def test_a_budget_the_gpu_cannot_hold_fails_with_the_largest_that_does():
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    net = ConvS2S(PRESETS["iwslt_de_en"](), 8000, 8000).to(device)
    precision = Precision("bf16", "test")
    base = torch.cuda.memory_allocated(device)  # the weights
    peak = check_fits(net, WorstStep(2000, 60, 60), precision, device, 0.1)
    assert peak and peak > base + sum(p.numel() * 4 for p in net.parameters())  # + gradients
    assert not any(p.grad is not None for p in net.parameters())  # the probe leaves none
    # This process may use what a 2,000-token step takes plus four times its activations and
    # gradients (its allocator refuses more): 40,000 tokens cannot fit, and the message names
    # a budget whose own worst step passes the same check.
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((base + 5 * (peak - base)) / HEADROOM / total,
                                               device)
    try:
        huge = WorstStep(max_tokens=40000, longest_src=200, longest_tgt=200)
        with pytest.raises(BudgetTooLarge, match=r"largest budget that fits is [\d,]+ tokens") \
                as err:
            check_fits(net, huge, precision, device, 0.1)
        best = int(str(err.value).split("largest budget that fits is ")[1].split(" ")[0]
                   .replace(",", ""))
        assert 2000 <= best < 40000 and f"--max-tokens {best}" in str(err.value)
        assert check_fits(net, WorstStep(best, 200, 200), precision, device, 0.1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


@pytest.mark.gpu
def test_with_static_shapes_the_probe_peaks_at_the_padded_step():
    """Short sentences padded to the multiple: the probe's peak is the padded step's, well
    over the unpadded one's."""
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    net = ConvS2S(PRESETS["iwslt_de_en"](), 8000, 8000).to(device)
    precision = Precision("bf16", "test")
    worst = WorstStep(3000, 3, 3)  # 1,000 pairs of 3 pieces: padded to 1,101 x 8
    plain = check_fits(net, worst, precision, device, 0.1)
    padded = check_fits(net, worst, precision, device, 0.1, static_shapes=8)
    base = torch.cuda.memory_allocated(device)
    assert padded - base > 1.5 * (plain - base)


def _agree_worker(rank: int, port: int, result: dict):
    import torch.distributed as dist

    from convs2s.train.comm import Comm

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    comm = Comm.create()
    # round 1: every rank fits; round 2: rank 1 alone cannot hold the budget
    agree_on_fit(comm, None)
    mine = BudgetTooLarge("the budget does not fit: use 2500") if rank == 1 else None
    try:
        agree_on_fit(comm, mine)
        result[rank] = "went on"
    except BudgetTooLarge as err:
        result[rank] = str(err)
    dist.destroy_process_group()


def test_one_rank_that_cannot_hold_the_budget_stops_every_rank():
    """A world's ranks agree (a collective): when one rank's GPU cannot hold the budget, every
    rank raises the same error naming that rank, rather than the others going on to wait for it
    in the first all-reduce. Three real gloo ranks on the CPU; under Ray Train the workers then
    return the message to the driver instead of raising (no restarts to fail again)."""
    result = run_ranks(_agree_worker, 3)
    assert set(result.values()) == {"rank 1 of 3: the budget does not fit: use 2500"}, result
    assert sorted(result) == [0, 1, 2]


def test_a_single_process_raises_its_own_message_unchanged():
    from convs2s.train.comm import Comm

    agree_on_fit(Comm(), None)  # fits: nothing happens
    with pytest.raises(BudgetTooLarge, match=r"^does not fit: use 1500$"):
        agree_on_fit(Comm(), BudgetTooLarge("does not fit: use 1500"))
