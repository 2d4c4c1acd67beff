"""Tests of convs2s.config: presets as in docs/reference.md (Presets), round trips, validation,
token ids.

Run: .venv/bin/python -m pytest tests/test_config.py -q
"""

from __future__ import annotations

import json
import re

import pytest

from convs2s import config
from convs2s.config import PRESETS, ModelConfig


def test_special_ids_agree_with_preprocessing():
    assert (config.BOS, config.PAD, config.EOS, config.UNK) == (0, 1, 2, 3)
    from preprocessing import vocab

    assert (vocab.BOS, vocab.PAD, vocab.EOS, vocab.UNK) == (0, 1, 2, 3)


def test_presets_follow_the_reference_table():
    assert {"wmt14_en_fr", "wmt14_en_de", "wmt16_en_ro", "gigaword", "iwslt_de_en",
            "tiny"} <= set(PRESETS)
    de = PRESETS["wmt14_en_de"]()
    assert de.embed_dim == 768 and de.out_embed_dim == 512
    assert de.encoder_layers == [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
    assert de.decoder_layers == de.encoder_layers
    fr = PRESETS["wmt14_en_fr"]()
    assert fr.encoder_layers == ([(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3
                                 + [(2048, 1), (4096, 1)])
    assert fr.dropout == 0.1 and de.dropout == 0.2
    ro = PRESETS["wmt16_en_ro"]()
    assert ro.encoder_layers == ro.decoder_layers == [(512, 3)] * 20 and ro.embed_dim == 512
    iw = PRESETS["iwslt_de_en"]()
    assert iw.encoder_layers == [(256, 3)] * 4 and iw.decoder_layers == [(256, 3)] * 3
    gw = PRESETS["gigaword"]()
    assert gw.encoder_layers == gw.decoder_layers == [(256, 3)] * 6
    for make in PRESETS.values():  # attention in every decoder layer by default (§3.3)
        cfg = make()
        assert cfg.attention_layers == (True,) * len(cfg.decoder_layers)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dict_round_trip_through_json(name):
    cfg = PRESETS[name]()
    d = json.loads(json.dumps(cfg.to_dict()))
    assert ModelConfig.from_dict(d) == cfg


def test_attention_subset_round_trip():
    cfg = PRESETS["tiny"]().replace(decoder_attention=[True, False])
    assert cfg.attention_layers == (True, False)
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("change,message", [
    (dict(decoder_attention=(True,)), "one flag per layer"),
    (dict(share_decoder_embed=True, out_embed_dim=16), "out_embed_dim == embed_dim"),
    (dict(dropout=1.0), "dropout"),
    (dict(embed_dim=-8), "embed_dim must be a positive integer"),
    (dict(out_embed_dim=0), "out_embed_dim must be a positive integer"),
    (dict(encoder_layers=[]), "encoder_layers is .*at least one layer"),
    (dict(encoder_layers=[(32, 0)]), "two positive integers"),
    (dict(decoder_layers=[(32, 3.5), (32, 3)]), "two positive integers"),
    (dict(decoder_layers=[(32,), (32, 3)]), "two positive integers"),
    (dict(encoder_layers=[(True, 3)]), "two positive integers"),
    (dict(max_positions=1), "max_positions must be an integer >= 2"),
])
def test_invalid_configs_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        PRESETS["tiny"]().replace(**change)


def test_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**PRESETS["tiny"]().to_dict(), "n_layers": 3})


def test_saved_and_file_settings_are_typed_as_set_values_are():
    """from_dict (a --config file's sections, `python -m convs2s train --set`) checks each
    value against its field's type by --set's rules: a string lr or warmup_updates failed
    only in a training worker."""
    from convs2s.config import SearchConfig, TrainConfig

    for cls, field, value, says in ((TrainConfig, "lr", "1e-3", "lr takes float, not '1e-3'"),
                                    (TrainConfig, "warmup_updates", "200",
                                     "warmup_updates takes int, not '200'"),
                                    (TrainConfig, "max_updates", 2.5,
                                     "max_updates takes int, not 2.5"),
                                    (SearchConfig, "replace_unk", "yes",
                                     "replace_unk takes bool, not 'yes'"),
                                    (ModelConfig, "dropout", None,
                                     "dropout takes float, not None")):
        d = {**cls().to_dict(), field: value} if cls is not ModelConfig else \
            {**PRESETS["tiny"]().to_dict(), field: value}
        with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
            cls.from_dict(d)
    # what JSON and a checkpoint hold: ints for floats, lists or tuples for sequences
    t = TrainConfig.from_dict({**TrainConfig().to_dict(), "lr": 1, "adam_betas": [0.9, 0.98],
                               "dropout_by_passes": ((0, 0.3),), "compile": False})
    assert (t.lr, t.adam_betas, t.dropout_by_passes, t.compile) == \
        (1.0, (0.9, 0.98), ((0.0, 0.3),), "")


@pytest.mark.parametrize("change, says", [
    (dict(lr=0.0), "lr must be > 0"), (dict(momentum=1.0), "momentum must be in [0, 1)"),
    (dict(adam_betas=(0.9,)), "adam_betas is (beta1, beta2)"),
    (dict(adam_betas=(0.9, 1.5)), "adam_betas is (beta1, beta2)"),
    (dict(adam_eps=0.0), "adam_eps must be > 0"), (dict(lr_shrink=0.0), "lr_shrink must be"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(clip_norm=-1.0), "clip_norm must be >= 0"),
    (dict(warmup_updates=-5), "warmup_updates must be >= 0"),
    (dict(max_updates=-1), "max_updates must be >= 0"),
    (dict(seed=-1), "seed must be >= 0"),  # (numpy's generators, the epoch's plan, refuse it)
    (dict(compile="inducter"), "compile='inducter': not a torch.compile backend"),
    (dict(fuse="false"), "fuse='false': not a torch.compile backend"),
])
def test_recipes_out_of_range_are_refused_when_made(change, says):
    from convs2s.config import TrainConfig

    with pytest.raises(ValueError, match=re.escape(says)):
        TrainConfig(**change)


@pytest.mark.parametrize("change, says", [
    (dict(max_len_a=0, max_len_b=3, min_len=6),
     "min_len=6 is more output pieces than max_len_b=3 allows (max_len_a=0): lower min_len "
     "or raise max_len_b"),
    (dict(max_len_a=0, max_len_b=0, min_len=0),
     "max_len_b=0 with max_len_a=0 allows no output piece: give max_len_b >= 1 (or "
     "max_len_a > 0)"),
])
def test_search_lengths_that_leave_no_translation_are_refused_when_made(change, says):
    """EOS banned by min_len and forced at max_len_b (or nothing but EOS at all): every
    output would be cut there, scored about -1e4. Per-sentence lengths (max_len_a > 0) are
    checked by the search itself (tests/test_search.py)."""
    from convs2s.config import SearchConfig

    with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
        SearchConfig(**change)
    # the boundaries: exactly min_len pieces (the benchmarks' fixed-length search), and a
    # length that grows with the source
    assert SearchConfig(max_len_a=0, max_len_b=6, min_len=6).max_len_b == 6
    assert SearchConfig(max_len_a=0.5, max_len_b=0, min_len=0).max_len_b == 0


def test_set_values_and_config_files_read_numbers_as_yaml_1_2():
    """PyYAML (YAML 1.1) reads 1e-3 as text and 1:30 as 90 (base 60): a setting read 1e-3
    from a file as the string "1e-3", and `--set train.max_time=1:30` as 90 seconds."""
    from storage.settings import load_yaml, read_value

    assert [read_value(t) for t in ("1e-3", "2.5E-1", "1.0e-08", "3600", "010", "0x10")] == \
        [0.001, 0.25, 1e-8, 3600, 10, 16]
    assert [read_value(t) for t in ("1:30", '"1e-3"', "5e", "abc")] == \
        ["1:30", "1e-3", "5e", "abc"]
    assert [read_value(t) for t in ("false", "off", "no", "null")] == [False, False, False, None]
    assert load_yaml("lr: 1e-3\nmax_time: 1:30\n") == {"lr": 0.001, "max_time": "1:30"}
