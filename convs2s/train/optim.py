"""Optimizer, learning-rate schedules and gradient renormalization of the paper (§4.2).

    optimizer = build_optimizer(model.parameters(), cfg)     # Nesterov SGD, momentum 0.99
    schedule = LRSchedule(cfg)
    for epoch in ...:                                        # epochs are 1-based
        for update in ...:
            set_lr(optimizer, schedule.lr_at(update))        # warmup, then the epoch's lr
            ...backward...; gnorm = clip_gradients(params, cfg.clip_norm); optimizer.step()
        schedule.end_epoch(epoch, valid_loss)                # anneal
        if schedule.should_stop(): break                     # lr fell below min_lr

Schedules (TrainConfig.lr_schedule):
- "anneal" (paper §4.2 read as written, and as its authors' code anneals, fairseq-lua's
  default "fast" annealing): "once the validation perplexity stops improving, we reduce the
  learning rate by an order of magnitude after each epoch": the first epoch whose validation
  loss is not below the epoch before's divides the lr by 10, and so does every later epoch
  (perplexity = exp(loss), so comparing losses is the same): training ends a few epochs later.
- "plateau" (fairseq-py's reduce-on-plateau reading): divide the lr by 10 after every epoch
  whose validation perplexity did not improve on the best so far (docs/reference.md, Recipes).
- "fixed" (reference recipe): the lr stays fixed, then from epoch `anneal_from_epoch` on it is
  multiplied by `lr_shrink` once per epoch: lr_e = lr * shrink^(e + 1 - anneal_from_epoch).
All three stop training once the lr falls below `min_lr` (1e-4).
- "cosine" / "linear" (budgeted training): the lr falls from `lr` to 0 as the run spends its
  budget; `lr_at(update, spent)` takes the fraction spent (0..1), which the training loop
  measures against max_time, max_updates or max_epochs. A run stopped by its budget thus ends
  annealed, wherever the budget falls.
An optional linear warmup over the first `warmup_updates` updates ramps from `warmup_init_lr`
to the scheduled lr.

torch's SGD(nesterov=True) applies the lr outside the momentum buffer, which is the reference's
NAG with its lr-change correction: a shrunk lr does not rescale the accumulated velocity. Weight
decay is the reference's too, decoupled (`NAG`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from convs2s.config import BUDGET_SCHEDULES, TrainConfig


def build_optimizer(params: Iterable[torch.nn.Parameter],
                    cfg: TrainConfig) -> torch.optim.Optimizer:
    """Nesterov accelerated gradient with the paper's momentum 0.99 and lr 0.25 (the default),
    or Adam (`optimizer="adam"`, betas `adam_betas`; decoupled weight decay as AdamW).

    Parameters on a GPU get the fused implementation (one kernel for every parameter instead of
    a few per tensor list: the step's optimizer launches stop depending on the parameter count);
    elsewhere PyTorch's default (on the CPU, its loop over the tensors one by one)."""
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    if cfg.optimizer == "adam":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                 weight_decay=cfg.weight_decay, fused=fused or None)
    return NAG(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
               fused=fused or None)


class NAG(torch.optim.SGD):
    """torch's SGD(nesterov=True) with the reference's weight decay: decoupled, the weights
    shrunk by (1 - lr * weight_decay) before the step, as the reference's NAG does. torch's
    own adds weight_decay * w to the gradient, where momentum 0.99 carries it on for about
    100 updates (w = 1, lr 0.25, weight_decay 1e-3, no gradient: 0.951 after 200 steps the
    reference's way, -0.34 torch's). The decay is a key of each parameter group
    (`decoupled_weight_decay`), so it travels with the optimizer's state dict."""

    def __init__(self, params, lr: float, momentum: float, weight_decay: float = 0.0,
                 fused: bool | None = None):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=True, weight_decay=0.0,
                         fused=fused)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = weight_decay

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            decay = group.get("decoupled_weight_decay", 0.0)
            weights = [p for p in group["params"] if p.grad is not None]
            if decay and weights:
                torch._foreach_mul_(weights, 1.0 - group["lr"] * decay)
        return super().step(closure)


# How a group's step runs, chosen for where its parameters live (`build_optimizer`), not a
# training setting: `load_state_dict` would otherwise restore the saving run's choice (a GPU
# run resumed from a CPU-written checkpoint lost its fused step; a CPU run got fused=True).
IMPLEMENTATION_KEYS = ("fused", "foreach")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)` (lr, momentum buffers, ...), keeping the fused /
    foreach choice `build_optimizer` made for this run's device."""
    chosen = [{k: g[k] for k in IMPLEMENTATION_KEYS if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, keep in zip(optimizer.param_groups, chosen):
        group.update(keep)
        if group.get("fused"):  # torch placed each `step` by the saving run's groups: a CPU
            # run's stay on the CPU, where a fused GPU step refuses them (Adam's state_steps)
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                if torch.is_tensor(st.get("step")) and st["step"].device != p.device:
                    st["step"] = st["step"].to(device=p.device, dtype=torch.float32)
        if isinstance(optimizer, NAG) and "decoupled_weight_decay" not in group:
            # a state saved before NAG decayed as the reference does: its decay, decoupled
            group["decoupled_weight_decay"], group["weight_decay"] = group["weight_decay"], 0.0


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Renormalize gradients to norm `max_norm` when larger (paper §4.2: 0.1); returns the norm
    before clipping as a 0-d tensor (no host sync; read it only when logging)."""
    params = [p for p in params if p.grad is not None]
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


class LRSchedule:
    """Epoch-level annealing plus per-update warmup. State is a small dict of Python floats."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        # the lr the "fixed" schedule shrinks from: the run's own, kept in its state (a resume
        # asking another lr goes on with the run's schedule, as every schedule does)
        self.base_lr = cfg.lr
        # the lr of the current epoch, before warmup ("fixed" from anneal_from_epoch=1: shrunk
        # from the first epoch on, as fixed_lr says)
        self.epoch_lr = self.fixed_lr(1) if cfg.lr_schedule == "fixed" else cfg.lr
        self.best_loss: float | None = None  # best validation loss seen (best/)
        # best at an epoch's end: what "plateau" compares the next epoch's end with (a limit's
        # mid-epoch validation is not an epoch: a rerun validating the same weights at that
        # epoch's end found "no improvement" and divided the lr by 10)
        self.epoch_best: float | None = None
        self.epochs_done = 0
        # "anneal": the last epoch's validation loss before annealing began, and whether it
        # has begun (from then on every epoch divides the lr)
        self.prev_loss: float | None = None
        self.annealing = False

    def lr_at(self, update: int, spent: float = 0.0) -> float:
        """lr for the update numbered `update` (0-based count of updates done before it);
        `spent`: the fraction of the run's budget spent ("cosine" / "linear" only)."""
        lr = self.epoch_lr
        spent = min(max(spent, 0.0), 1.0)
        if self.cfg.lr_schedule == "cosine":
            lr *= 0.5 * (1.0 + math.cos(math.pi * spent))
        elif self.cfg.lr_schedule == "linear":
            lr *= 1.0 - spent
        w = self.cfg.warmup_updates
        if w > 0 and update < w:
            frac = (update + 1) / w
            return self.cfg.warmup_init_lr + (lr - self.cfg.warmup_init_lr) * frac
        return lr

    def end_epoch(self, epoch: int, val_loss: float | None) -> float:
        """Anneal after the (1-based) `epoch` finished with validation loss `val_loss`; returns
        the lr of the next epoch."""
        self.epochs_done = epoch
        if self.cfg.lr_schedule in BUDGET_SCHEDULES:  # annealed by the budget, per update
            if val_loss is not None and (self.best_loss is None or val_loss < self.best_loss):
                self.best_loss = float(val_loss)
        elif self.cfg.lr_schedule == "anneal":
            if val_loss is not None:
                if self.annealing or (self.prev_loss is not None
                                      and not val_loss < self.prev_loss):
                    self.epoch_lr *= self.cfg.lr_shrink  # stopped improving: every epoch now
                    self.annealing = True
                else:
                    self.prev_loss = float(val_loss)
                if self.best_loss is None or val_loss < self.best_loss:
                    self.best_loss = float(val_loss)
        elif self.cfg.lr_schedule == "plateau":
            if val_loss is not None:
                if self.epoch_best is not None and not val_loss < self.epoch_best:
                    self.epoch_lr *= self.cfg.lr_shrink  # no improvement this epoch
                if self.best_loss is None or val_loss < self.best_loss:
                    self.best_loss = float(val_loss)
        else:
            if val_loss is not None and (self.best_loss is None or val_loss < self.best_loss):
                self.best_loss = float(val_loss)
            self.epoch_lr = self.fixed_lr(epoch + 1)
        if val_loss is not None and (self.epoch_best is None or val_loss < self.epoch_best):
            self.epoch_best = float(val_loss)
        return self.epoch_lr

    def mid_epoch(self, val_loss: float) -> None:
        """A validation inside an epoch (a limit stopped training there): best/ may move; the
        schedule does not (no annealing, and the epoch's end still compares with the epochs)."""
        if self.best_loss is None or val_loss < self.best_loss:
            self.best_loss = float(val_loss)

    def fixed_lr(self, epoch: int) -> float:
        """"fixed" schedule: lr of the (1-based) `epoch`."""
        start = self.cfg.anneal_from_epoch
        if start is None or epoch < start:
            return self.base_lr
        return self.base_lr * self.cfg.lr_shrink ** (epoch + 1 - start)

    def should_stop(self) -> bool:
        """The lr fell below min_lr (the epoch schedules; "cosine" / "linear" end with their
        budget, their lr reaching 0 there)."""
        return self.cfg.lr_schedule not in BUDGET_SCHEDULES and self.epoch_lr < self.cfg.min_lr

    def state_dict(self) -> dict:
        return {"epoch_lr": self.epoch_lr, "base_lr": self.base_lr, "best_loss": self.best_loss,
                "epoch_best": self.epoch_best, "epochs_done": self.epochs_done,
                "prev_loss": self.prev_loss, "annealing": self.annealing}

    def load_state_dict(self, state: dict) -> None:
        self.epoch_lr = float(state["epoch_lr"])
        self.best_loss = None if state["best_loss"] is None else float(state["best_loss"])
        self.epochs_done = int(state["epochs_done"])
        # (a checkpoint from before epoch_best: its best_loss, as the schedule compared then)
        epoch_best = state.get("epoch_best", state["best_loss"])
        self.epoch_best = None if epoch_best is None else float(epoch_best)
        prev = state.get("prev_loss")  # (a checkpoint from before "anneal": none, not begun)
        self.prev_loss = None if prev is None else float(prev)
        self.annealing = bool(state.get("annealing", False))
        if "base_lr" in state:
            self.base_lr = float(state["base_lr"])
        elif self.cfg.lr_schedule == "fixed":  # (a checkpoint from before base_lr: the lr its
            # current epoch had, unshrunk by the epochs the schedule shrank it)
            start, epoch = self.cfg.anneal_from_epoch, self.epochs_done + 1
            shrunk = 0 if start is None or epoch < start else epoch + 1 - start
            self.base_lr = self.epoch_lr / self.cfg.lr_shrink ** shrunk
