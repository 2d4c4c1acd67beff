"""Training precision (convs2s.precision): `auto` picks bf16 autocast only where every rank's
hardware multiplies bf16 natively, float32 elsewhere and on a mixed cluster; bf16 on a CPU
trains (master weights, optimizer state and the loss in float32) and its checkpoints load in
float32. The Ray Train run's tag is checked in test_train.py.

Run: .venv/bin/python -m pytest tests/test_precision.py -q
"""

from __future__ import annotations

import sys

import pytest
import torch

from convs2s.io.checkpoint import load_model, save_checkpoint
from convs2s.config import EOS, PRESETS, TrainConfig
from convs2s.train.collate import collate_lists
from convs2s.model.network import ConvS2S
from convs2s.train.optim import build_optimizer
from convs2s.precision import (
    OVERRIDE_ENV,
    Precision,
    common_precision,
    cpu_flags,
    cpu_native_bf16,
    local_precision,
)
from convs2s.train.comm import Comm
from convs2s.train.update import autocast_for, train_update, validate

CPU = torch.device("cpu")
V = 40


def batches(seed: int, n: int = 2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        src = [torch.randint(4, V, (int(torch.randint(3, 9, (1,), generator=g)),),
                             generator=g).tolist() + [EOS] for _ in range(4)]
        tgt = [torch.randint(4, V, (int(torch.randint(3, 9, (1,), generator=g)),),
                             generator=g).tolist() + [EOS] for _ in range(4)]
        out.append(collate_lists(src, tgt))
    return out


def tiny_model() -> ConvS2S:
    torch.manual_seed(1)
    return ConvS2S(PRESETS["tiny"](), V, V)


# --- the choice --------------------------------------------------------------------------------


def test_the_cpu_detector_reads_the_native_bf16_flags(monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    assert cpu_native_bf16({"avx2", "avx512f", "avx512_bf16"}) == \
        (True, "CPU flags avx512_bf16")
    assert cpu_native_bf16({"avx2", "amx_bf16", "amx_tile"})[0]
    assert cpu_native_bf16({"fp", "asimd", "bf16"})[0]  # aarch64 "Features"
    # AVX-512 alone is not enough: torch then emulates bf16, slower than float32
    ok, why = cpu_native_bf16({"avx2", "avx512f", "avx512bw", "avx512vl"})
    assert not ok and "no avx512_bf16" in why
    flags = cpu_flags()  # this host's, read once (/proc/cpuinfo on Linux)
    if sys.platform == "linux":
        assert flags and ("fpu" in flags or "fp" in flags), flags
    else:
        assert flags is None or "fpu" in flags or "fp" in flags


def test_the_detector_can_be_forced_and_auto_then_picks_float32(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert cpu_native_bf16({"avx512_bf16"}) == (False, f"{OVERRIDE_ENV}=0")
    p = local_precision("auto", CPU)
    assert p.name == "fp32" and p.dtype == torch.float32
    assert p.reason.startswith("auto: no native bf16") and f"{OVERRIDE_ENV}=0" in p.reason
    assert not torch.is_autocast_enabled("cpu")
    with autocast_for(CPU, TrainConfig(precision="auto")):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    p = local_precision("auto", CPU)
    assert p.name == "bf16" and p.dtype == torch.bfloat16 and "native bf16" in p.reason
    with autocast_for(CPU, TrainConfig(precision="auto")):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_a_world_agrees_on_one_precision():
    native = [("node-a", True, "CPU flags avx512_bf16"), ("node-a", True, "CPU flags avx512_bf16")]
    assert common_precision("auto", native).name == "bf16"
    # one node without native bf16: float32 on every node, and the reason names that node
    mixed = native + [("node-b", False, "no avx512_bf16 / amx_bf16 CPU flag")]
    p = common_precision("auto", mixed)
    assert p == Precision("fp32", p.reason) and "node-b lacks native bf16" in p.reason
    assert "float32 on every node" in p.reason
    # asked for: taken as asked, the emulated nodes named
    p = common_precision("bf16", mixed)
    assert p.name == "bf16" and "emulated, slower than float32, on node-b" in p.reason
    assert common_precision("fp32", native).name == "fp32"
    # two ranks of one host that differ (a V100 beside an A100): the host is not native
    p = common_precision("auto", [("gpu-node", True, "A100 (compute 8.0)"),
                        ("gpu-node", False, "V100 (compute 7.0, bf16 native from 8.0)")])
    assert p.name == "fp32" and "A100" in p.reason and "V100" in p.reason
    with pytest.raises(ValueError, match="choose one of auto, fp32, bf16"):
        common_precision("fp16", native)


def test_the_setting_is_a_choice_and_old_configs_load():
    assert TrainConfig().precision == "auto"
    with pytest.raises(ValueError, match="precision must be"):
        TrainConfig(precision="half")
    # configs saved before `precision` (every old checkpoint's train_config) held bf16: bool
    old = {k: v for k, v in TrainConfig().to_dict().items() if k != "precision"}
    assert TrainConfig.from_dict({**old, "bf16": True}).precision == "auto"
    assert TrainConfig.from_dict({**old, "bf16": False}).precision == "fp32"


def test_one_table_says_what_each_precision_means_to_training_and_inference_and_where(
        monkeypatch):
    from convs2s.config import INFERENCE_PRECISIONS, TRAINING_PRECISIONS
    from convs2s.inference.quantize import Int8Linear, for_inference, unavailable
    from convs2s.model.network import inference_copy
    from convs2s.precision import MODES, inference_unavailable, runs_on_gpus

    # every --precision a command offers is a row of the table (training's: `auto` besides)
    assert INFERENCE_PRECISIONS == tuple(MODES) == ("fp32", "bf16", "int8")
    assert TRAINING_PRECISIONS == ("auto", "fp32", "bf16")
    with pytest.raises(ValueError, match="'int8': choose one of fp32, bf16"):
        Precision("int8", "no int8 training")
    # training: the row's autocast is the context the forward passes run in, and its dtype
    for name in TRAINING_PRECISIONS[1:]:
        with Precision(name, "asked").autocast(CPU):
            on = torch.is_autocast_enabled("cpu")
            dtype = torch.get_autocast_dtype("cpu")
        assert on == (MODES[name].autocast is not None), name
        assert not on or dtype == Precision(name, "asked").dtype == torch.bfloat16
    # inference: the row's weights are what an inference copy becomes
    for name in INFERENCE_PRECISIONS:
        net = for_inference(inference_copy(tiny_model()), name)
        fc = net.decoder.fc3
        kind = "int8" if isinstance(fc, Int8Linear) else str(fc.weight.dtype).split(".")[1]
        assert (net.precision, kind) == (name, MODES[name].weights)
        assert kind == {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}[name]
    # the device rule: int8 on CPUs only, the others anywhere; bf16 inference on a GPU only
    # where it multiplies bf16 natively (compute 8.0 on)
    assert [runs_on_gpus(n) for n in INFERENCE_PRECISIONS] == [True, True, False]
    assert inference_unavailable("int8", "cuda") == \
        "int8 inference runs on CPUs, not on cuda: use precision bf16 there"
    assert unavailable("int8", "cuda") == inference_unavailable("int8", "cuda")
    assert all(inference_unavailable(n, "cpu") is None for n in INFERENCE_PRECISIONS)
    # fp32 / bf16 are limited to no device (a device type besides CPUs and GPUs: as before)
    assert inference_unavailable("fp32", "meta") is None
    assert for_inference(inference_copy(tiny_model()).to("meta"), "fp32").precision == "fp32"
    from convs2s import precision

    monkeypatch.setattr(precision, "native_bf16", lambda d: (False, "V100 (compute 7.0)"))
    assert inference_unavailable("bf16", "cuda") == \
        "this GPU (V100 (compute 7.0)) has no native bf16: use precision fp32"
    assert inference_unavailable("fp32", "cuda") is None
    monkeypatch.setattr(precision, "native_bf16", lambda d: (True, "H100 (compute 9.0)"))
    assert inference_unavailable("bf16", "cuda") is None


# --- bf16 on a CPU -----------------------------------------------------------------------------


def test_bf16_on_a_cpu_multiplies_in_bf16_and_keeps_the_loss_in_float32():
    model, b = tiny_model().eval(), batches(0, 1)[0]
    with torch.no_grad(), autocast_for(CPU, TrainConfig(precision="bf16")):
        enc = model.encoder(b.src_tokens, b.src_lengths)
        loss, nll = model(b.src_tokens, b.src_lengths, b.prev_output_tokens, target=b.target)
    assert enc.keys.dtype == torch.bfloat16  # the matrix products ran in bf16
    assert loss.dtype == nll.dtype == torch.float32  # the log-softmax did not
    with torch.no_grad():
        ref, _ = model(b.src_tokens, b.src_lengths, b.prev_output_tokens, target=b.target)
    assert float(loss) == pytest.approx(float(ref), rel=2e-2)


def test_bf16_training_on_a_cpu_learns_and_its_checkpoint_loads_in_float32(tmp_path):
    data = batches(2)
    losses = {}
    for precision in ("fp32", "bf16"):
        cfg = TrainConfig(lr=0.25, precision=precision)
        model = tiny_model()
        opt = build_optimizer(model.parameters(), cfg)
        curve = []
        for _ in range(30):
            s = train_update(model, opt, data, cfg, Comm(), CPU)
            curve.append(float(s.loss_sum) / s.ntokens)
            assert torch.isfinite(s.grad_norm)
        losses[precision] = curve
        # master weights and the optimizer's momentum stay float32
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(v.dtype == torch.float32 for st in opt.state.values() for v in st.values()
                   if torch.is_tensor(v))
    assert losses["bf16"][-1] < 0.5 * losses["bf16"][0]  # it learns ...
    assert losses["bf16"][0] == pytest.approx(losses["fp32"][0], rel=2e-2)  # ... the same start
    assert losses["bf16"][-1] == pytest.approx(losses["fp32"][-1], rel=0.25, abs=0.1)

    # the bf16-trained weights are float32 tensors: saved and loaded as any checkpoint
    cfg = PRESETS["tiny"]()
    path = save_checkpoint(tmp_path / "ckpt", {
        "model": model.state_dict(), "model_config": cfg.to_dict(), "src_vocab_size": V,
        "tgt_vocab_size": V, "epoch": 1, "update": 30, "precision": "bf16"})
    loaded, _ = load_model(path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    total = validate(loaded, data, Comm(), CPU, TrainConfig(precision="fp32"))
    assert total[2] == sum(b.ntokens for b in data) and total[1] / total[2] < losses["fp32"][0]


def test_an_auto_run_resumed_on_other_hardware_keeps_its_precision_and_says_so(
        demo_batches, tmp_path, monkeypatch, capsys):
    """`precision=auto` was decided again at each start: a run Ray restarted on nodes without
    native bf16 went on in float32 without a word (its checkpoints said bf16, then fp32)."""
    from convs2s.io.checkpoint import load_checkpoint
    from convs2s.train.job import TrainJob
    from convs2s.train.local import fit_local

    def run(updates: int):
        train = TrainConfig(max_epochs=0, max_updates=updates, log_interval=1000, seed=3,
                            shuffle_buffer=8, precision="auto")
        return fit_local(TrainJob(model=PRESETS["tiny"](), train=train,
                                  train_data=demo_batches.batches["train"],
                                  valid_data=demo_batches.batches["valid"],
                                  spm_model=demo_batches.spm_model,
                                  vocab_size=demo_batches.vocab_size,
                                  storage_path=str(tmp_path / "runs"), run_name="r",
                                  system_metrics_s=0.0))

    monkeypatch.setenv("CONVS2S_CPU_BF16", "1")
    assert load_checkpoint(run(3).last_checkpoint)["precision"] == "bf16"
    monkeypatch.setenv("CONVS2S_CPU_BF16", "0")  # the same run, resumed on another host type
    capsys.readouterr()
    assert load_checkpoint(run(6).last_checkpoint)["precision"] == "bf16"
    said = capsys.readouterr()
    assert "precision bf16: auto, kept from the checkpoint resumed; fp32 here" in \
        said.out + said.err
