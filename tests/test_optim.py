"""Tests of convs2s.train.optim and convs2s.model.loss: the paper's annealing rule (lr trajectory
for a given
validation sequence), the reference's fixed schedule, warmup, gradient renormalization, the
Nesterov update, and the token-summed loss with label smoothing.

Run: .venv/bin/python -m pytest tests/test_optim.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from convs2s.config import PAD, TrainConfig
from convs2s.model.loss import sequence_loss
from convs2s.train.optim import (LRSchedule, build_optimizer, clip_gradients,
                                 load_optimizer_state)


def trajectory(schedule: LRSchedule, val_losses: list[float]) -> tuple[list[float], int]:
    """lr of every epoch (the first is the initial lr) and the epoch after which training stops."""
    lrs = [schedule.epoch_lr]
    for epoch, val in enumerate(val_losses, start=1):
        lrs.append(schedule.end_epoch(epoch, val))
        if schedule.should_stop():
            return lrs, epoch
    return lrs, 0


def test_an_lr_below_min_lr_is_refused_where_its_schedule_would_stop_at_once():
    """An lr under min_lr (Adam's 5e-5 beside the paper's 1e-4) stopped the epoch schedules
    before their first update, with no word but "lr fell below min_lr" (a workflow then said
    "training finished without a checkpoint"): refused, naming both; the budget schedules,
    whose lr falls to 0 with the budget, never stop for it."""
    for schedule in ("plateau", "anneal", "fixed"):
        with pytest.raises(ValueError, match=r"lr 5e-05 is below min_lr 0.0001, where the "
                                             f"'{schedule}' schedule stops training"):
            TrainConfig(optimizer="adam", lr=5e-5, lr_schedule=schedule)
    for schedule in ("cosine", "linear"):
        s = LRSchedule(TrainConfig(optimizer="adam", lr=5e-5, lr_schedule=schedule))
        assert not s.should_stop() and s.lr_at(0, 0.5) > 0
        s.end_epoch(1, 3.0)
        assert not s.should_stop()


def test_plateau_divides_by_ten_after_each_non_improving_epoch_and_stops_below_min_lr():
    # Paper §4.2: lr 0.25; /10 whenever the validation perplexity did not improve on the best;
    # stop once the lr falls below 1e-4.
    vals = [5.0, 4.0, 4.2, 3.9, 3.9, 3.8, 3.85, 3.81, 3.7, 3.75]
    lrs, stop = trajectory(LRSchedule(TrainConfig(lr=0.25)), vals)
    expected = [0.25, 0.25, 0.25, 0.025, 0.025, 0.0025, 0.0025, 2.5e-4, 2.5e-5]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert stop == 8  # 2.5e-5 < 1e-4 after the 8th epoch: the last two values are never seen


def test_plateau_compares_with_the_best_not_the_previous_epoch():
    s = LRSchedule(TrainConfig(lr=1.0, min_lr=1e-9))
    lrs, _ = trajectory(s, [3.0, 3.5, 3.2, 2.9])
    # 3.2 improves on 3.5 but not on the best 3.0: still a plateau epoch.
    assert lrs == pytest.approx([1.0, 1.0, 0.1, 0.01, 0.01])
    assert s.best_loss == 2.9


def test_anneal_divides_every_epoch_once_validation_stops_improving_as_the_paper_says():
    """Paper §4.2 as written (and as its authors' code, fairseq-lua's "fast" annealing, does
    it): "once the validation perplexity stops improving, we reduce the learning rate by an
    order of magnitude after each epoch until it falls below 10^-4". The first epoch not
    better than the epoch before starts it; every later epoch divides again, better or not;
    training stops four epochs later. The state survives a resume mid-annealing."""
    vals = [5.0, 4.0, 4.1, 3.9, 3.8, 3.7, 3.6]
    s = LRSchedule(TrainConfig(lr=0.25, lr_schedule="anneal"))
    lrs, stop = trajectory(s, vals)
    assert lrs == pytest.approx([0.25, 0.25, 0.25, 0.025, 0.0025, 2.5e-4, 2.5e-5], rel=1e-12)
    assert stop == 6 and s.best_loss == 3.7  # 2.5e-5 < 1e-4 after the 6th epoch
    # "plateau" on the same losses keeps 0.025 while each epoch beats the best
    assert trajectory(LRSchedule(TrainConfig(lr=0.25)), vals)[0][3:] == \
        pytest.approx([0.025] * 5)
    # a worse epoch starts it at once; then every epoch divides, a better one too
    s = LRSchedule(TrainConfig(lr=1.0, lr_schedule="anneal", min_lr=1e-9))
    assert trajectory(s, [3.0, 2.0, 3.5])[0] == pytest.approx([1.0, 1.0, 1.0, 0.1])
    restored = LRSchedule(TrainConfig(lr=1.0, lr_schedule="anneal", min_lr=1e-9))
    restored.load_state_dict(s.state_dict())
    assert restored.end_epoch(4, 1.0) == pytest.approx(0.01)  # annealing goes on
    fresh = LRSchedule(TrainConfig(lr=1.0, lr_schedule="anneal", min_lr=1e-9))
    fresh.load_state_dict({k: v for k, v in s.state_dict().items()
                           if k not in ("prev_loss", "annealing")})  # (an older checkpoint)
    assert fresh.annealing is False and fresh.prev_loss is None


def test_fixed_schedule_shrinks_every_epoch_from_anneal_epoch():
    # Reference recipe: lr fixed, then x0.1 per epoch from epoch 3: lr_e = lr * 0.1^(e - 2).
    s = LRSchedule(TrainConfig(lr=0.5, lr_schedule="fixed", anneal_from_epoch=3, min_lr=1e-4))
    lrs, stop = trajectory(s, [9.0, 8.0, 7.0, 6.0, 5.0, 4.0])
    assert lrs == pytest.approx([0.5, 0.5, 0.05, 0.005, 5e-4, 5e-5])
    assert stop == 5
    assert s.best_loss == 5.0
    never = LRSchedule(TrainConfig(lr=0.5, lr_schedule="fixed"))
    assert trajectory(never, [1.0, 2.0, 3.0])[0] == [0.5] * 4
    # From the first epoch: shrunk from the start (the first epoch's lr was once left whole).
    first = LRSchedule(TrainConfig(lr=0.5, lr_schedule="fixed", anneal_from_epoch=1,
                                   min_lr=1e-9))
    assert trajectory(first, [3.0, 2.0])[0] == pytest.approx([0.05, 0.005, 5e-4])


def test_a_validation_inside_an_epoch_moves_best_but_not_the_plateau():
    # A limit stopped training inside an epoch (validated there, mid-epoch: best/ may move);
    # the rerun trains the epoch's rest and validates at its end, which compares with the
    # epochs' ends, not with that mid-epoch validation: an improvement on epoch 1, no
    # division by 10 (a stop at an epoch's last update is that epoch's end, not this).
    s = LRSchedule(TrainConfig(lr=0.25))
    s.end_epoch(1, 3.0)
    s.mid_epoch(2.5)
    assert s.best_loss == 2.5 and s.epoch_lr == 0.25
    restored = LRSchedule(TrainConfig(lr=0.25))
    restored.load_state_dict(s.state_dict())  # (the rerun resumes from that checkpoint)
    assert restored.end_epoch(2, 2.5) == 0.25
    assert restored.end_epoch(3, 2.6) == pytest.approx(0.025)  # a real plateau still anneals


def test_warmup_is_linear_then_the_epoch_lr():
    s = LRSchedule(TrainConfig(lr=0.2, warmup_updates=4, warmup_init_lr=0.0))
    assert [s.lr_at(u) for u in range(6)] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])


def test_budget_schedules_fall_to_zero_as_the_budget_is_spent_and_never_stop_early():
    cos = LRSchedule(TrainConfig(lr=0.4, lr_schedule="cosine"))
    lin = LRSchedule(TrainConfig(lr=0.4, lr_schedule="linear"))
    spent = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5]
    assert [cos.lr_at(100, f) for f in spent] == \
        pytest.approx([0.4, 0.4 * (0.5 + 0.5 ** 1.5), 0.2, 0.4 * (0.5 - 0.5 ** 1.5), 0.0, 0.0])
    assert [lin.lr_at(100, f) for f in spent] == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    # Validation does not anneal them (the budget does), and min_lr never stops them.
    for s in (cos, lin):
        lrs, stop = trajectory(s, [3.0, 3.5, 4.0, 4.5])
        assert lrs == [0.4] * 5 and stop == 0 and s.best_loss == 3.0
    # Warmup ramps to the scheduled lr.
    w = LRSchedule(TrainConfig(lr=0.4, lr_schedule="linear", warmup_updates=2))
    assert w.lr_at(0, 0.5) == pytest.approx(0.1) and w.lr_at(2, 0.5) == pytest.approx(0.2)


def test_schedule_state_round_trips():
    a = LRSchedule(TrainConfig())
    trajectory(a, [4.0, 4.5])
    b = LRSchedule(TrainConfig())
    b.load_state_dict(a.state_dict())
    assert (b.epoch_lr, b.best_loss, b.epochs_done) == (a.epoch_lr, a.best_loss, a.epochs_done)


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="lr_schedule"):
        TrainConfig(lr_schedule="exponential")
    with pytest.raises(ValueError, match="max_epochs, max_updates or max_time"):
        TrainConfig(max_epochs=0, max_updates=0)
    with pytest.raises(ValueError, match="max_time is in seconds"):
        TrainConfig(max_time=-1)
    assert TrainConfig(max_epochs=0, max_time=60).max_time == 60  # a time budget alone
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"lr": 0.1, "learning_rate": 0.1})
    assert TrainConfig.from_dict(TrainConfig(lr=0.3).to_dict()) == TrainConfig(lr=0.3)


def test_clip_gradients_renormalizes_to_max_norm_and_returns_the_old_norm():
    p, q = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    p.grad, q.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0, 0.0])
    norm = clip_gradients([p, q], 0.1)
    assert float(norm) == pytest.approx(5.0)
    total = torch.cat([p.grad, q.grad]).norm()
    assert float(total) == pytest.approx(0.1, rel=1e-5)
    assert p.grad[0] / q.grad[1] == pytest.approx(0.75)  # direction kept
    small = torch.nn.Parameter(torch.zeros(2))
    small.grad = torch.tensor([0.03, 0.04])
    assert float(clip_gradients([small], 0.1)) == pytest.approx(0.05)
    assert small.grad.tolist() == pytest.approx([0.03, 0.04])  # below the threshold: untouched


def test_nesterov_step_matches_the_formula():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = build_optimizer([w], TrainConfig(lr=0.25, momentum=0.99))
    g1, g2 = torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 0.25])
    for g in (g1, g2):
        w.grad = g.clone()
        opt.step()
    # buf1 = g1; w1 = w0 - lr (g1 + m buf1); buf2 = m buf1 + g2; w2 = w1 - lr (g2 + m buf2)
    m, lr = 0.99, 0.25
    w1 = torch.tensor([1.0, -2.0]) - lr * (g1 + m * g1)
    buf2 = m * g1 + g2
    assert w.detach() == pytest.approx((w1 - lr * (g2 + m * buf2)).tolist())


def test_weight_decay_with_nesterov_is_the_references_decoupled_decay():
    """The reference's NAG shrinks the weights by (1 - lr * wd) before its step; torch's SGD
    added wd * w to the gradient, which momentum 0.99 carries on (200 steps without a gradient
    from w = 1: 0.951 the reference's way, -0.34 the other). Written here as the reference
    writes it (buf = -lr * velocity, rescaled by lr / lr_old), through an lr annealed twice."""
    m, wd = 0.99, 1e-3
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = build_optimizer([w], TrainConfig(lr=0.25, momentum=m, weight_decay=wd))
    ref, buf, lr_old = w.detach().clone(), torch.zeros(2, dtype=torch.float64), 0.25
    torch.manual_seed(0)
    for step in range(60):
        lr = 0.25 if step < 20 else 0.025 if step < 40 else 0.0025
        for group in opt.param_groups:
            group["lr"] = lr
        g = torch.randn(2, dtype=torch.float64) if step % 3 else torch.zeros(2, dtype=torch.float64)
        w.grad = g.clone()
        opt.step()
        correct = lr / lr_old
        ref = ref * (1 - lr * wd) + buf * (m * m * correct) - (1 + m) * lr * g
        buf = buf * (m * correct) - lr * g
        lr_old = lr
    torch.testing.assert_close(w.detach(), ref, rtol=1e-12, atol=1e-12)
    assert opt.state_dict()["param_groups"][0]["decoupled_weight_decay"] == wd
    # a state saved before (torch's coupled weight_decay in its groups) resumes decoupled
    old = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.25, momentum=m,
                          nesterov=True, weight_decay=wd)
    resumed = build_optimizer([torch.nn.Parameter(torch.ones(2))], TrainConfig(lr=0.25))
    load_optimizer_state(resumed, old.state_dict())
    group = resumed.param_groups[0]
    assert (group["weight_decay"], group["decoupled_weight_decay"]) == (0.0, wd)


def _logits_and_target():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)  # B x T x V
    target = torch.tensor([[4, 5, 2], [6, 2, PAD]])
    return logits, target


def test_loss_is_a_sum_over_non_pad_tokens():
    logits, target = _logits_and_target()
    loss, nll = sequence_loss(logits, target)
    lp = torch.log_softmax(logits, -1)
    manual = -sum(lp[b, t, target[b, t]] for b in range(2) for t in range(3)
                  if target[b, t] != PAD)
    assert float(loss) == pytest.approx(float(manual), rel=1e-6)
    assert float(nll) == pytest.approx(float(manual), rel=1e-6)


def test_label_smoothing_follows_the_reference_formula():
    logits, target = _logits_and_target()
    eps, V = 0.1, logits.size(-1)
    loss, nll = sequence_loss(logits, target, label_smoothing=eps)
    lp = torch.log_softmax(logits, -1)
    keep = target != PAD
    nll_ref = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
    smooth = -lp.sum(-1)[keep].sum()
    ref = (1 - eps - eps / (V - 1)) * nll_ref + eps / (V - 1) * smooth
    assert float(loss) == pytest.approx(float(ref), rel=1e-6)
    assert float(nll) == pytest.approx(float(nll_ref), rel=1e-6)
    assert not math.isclose(float(loss), float(nll))


def test_loss_is_float32_for_bf16_logits():
    logits, target = _logits_and_target()
    loss, _ = sequence_loss(logits.bfloat16(), target, label_smoothing=0.1)
    assert loss.dtype == torch.float32


def test_adam_is_an_alternative_optimizer_with_its_own_settings():
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer([p], TrainConfig(optimizer="adam", lr=1e-3, adam_betas=[0.9, 0.98],
                                           weight_decay=0.01))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["weight_decay"] == 0.01
    nag = build_optimizer([p], TrainConfig())
    assert isinstance(nag, torch.optim.SGD) and nag.defaults["nesterov"]
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="lamb")


def _stepped(cfg: TrainConfig):
    """Two CPU parameters and their optimizer after one step: momentum buffers (NAG), moments
    and a step count (Adam)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = build_optimizer(params, cfg)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return params, optimizer


@pytest.mark.parametrize("optimizer", ["nag", "adam"])
def test_a_resumed_optimizer_keeps_its_own_devices_step_with_the_saved_state(optimizer):
    """A checkpoint written on a GPU (fused step) and resumed on the CPU: the momentum buffers
    and lr come back, the fused / foreach choice stays the one made for this device
    (`load_state_dict` alone would bring the GPU run's fused=True)."""
    cfg = TrainConfig(optimizer=optimizer, lr=0.3)
    gpu_params, written = _stepped(cfg)
    for group in written.param_groups:  # what build_optimizer chooses for a GPU's parameters
        group["fused"], group["foreach"], group["lr"] = True, False, 0.03
    saved = written.state_dict()

    resumed = build_optimizer([torch.nn.Parameter(torch.zeros_like(p)) for p in gpu_params],
                              cfg)
    chosen = [(g["fused"], g["foreach"]) for g in resumed.param_groups]
    load_optimizer_state(resumed, saved)
    assert [(g["fused"], g["foreach"]) for g in resumed.param_groups] == chosen == [(None, None)]
    assert resumed.param_groups[0]["lr"] == 0.03
    for key, buffer in saved["state"][0].items():  # momentum (NAG), moments and step (Adam)
        torch.testing.assert_close(resumed.state_dict()["state"][0][key], buffer, msg=key)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("optimizer", ["nag", "adam"])
def test_a_cpu_written_optimizer_state_resumes_on_a_gpu_with_its_fused_step(optimizer):
    """The other direction: a checkpoint written on the CPU resumed on a GPU keeps the fused
    step chosen there, and steps (torch placed Adam's `step` counts by the saving run's groups,
    on the CPU, where the fused GPU kernel refuses them: pytorch/pytorch#124133)."""
    cfg = TrainConfig(optimizer=optimizer, lr=0.3)
    cpu_params, written = _stepped(cfg)
    saved = written.state_dict()
    gpu_params = [torch.nn.Parameter(p.detach().cuda()) for p in cpu_params]
    resumed = build_optimizer(gpu_params, cfg)
    load_optimizer_state(resumed, saved)
    assert all(g["fused"] for g in resumed.param_groups)
    for p in gpu_params:
        p.grad = torch.ones_like(p)
    resumed.step()  # (raised "Expected all tensors to be on the same device" for Adam)
    written.step()
    for a, b in zip(cpu_params, gpu_params):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)


def test_a_fixed_schedule_resumed_with_another_lr_goes_on_from_the_runs_own():
    """Resumed with --set train.lr=1.0, a run trained at lr 0.5 is told its schedule goes on
    from its own state: the "fixed" schedule did so for the epoch under way only, then every
    later epoch was computed from the new lr (0.5 -> 1.0 at the next epoch's start), as no
    other schedule does. A checkpoint from before the base lr was kept: derived from its
    epoch's lr."""
    def run(cfg, epochs, state=None):
        s = LRSchedule(cfg)
        if state is not None:
            s.load_state_dict(state)
        return s, [s.end_epoch(e, 1.0) for e in epochs]

    def fixed(lr, start):
        return TrainConfig(lr=lr, lr_schedule="fixed", anneal_from_epoch=start, lr_shrink=0.1)

    for start in (None, 3):  # the lr fixed; then shrunk from epoch 3 on
        first, _ = run(fixed(0.5, start), [1, 2])
        _, straight = run(fixed(0.5, start), [1, 2, 3, 4])
        _, resumed = run(fixed(1.0, start), [3, 4], first.state_dict())
        assert resumed == pytest.approx(straight[2:]), (start, resumed, straight)
        old = {k: v for k, v in first.state_dict().items() if k != "base_lr"}
        _, from_old = run(fixed(1.0, start), [3, 4], old)
        assert from_old == pytest.approx(straight[2:]), (start, from_old, straight)
