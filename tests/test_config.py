"""Tests of convs2s.config: presets as in docs/reference.md (Presets), round trips, validation,
token ids.

Run: .venv/bin/python -m pytest tests/test_config.py -q
"""

from __future__ import annotations

import json

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
])
def test_invalid_configs_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        PRESETS["tiny"]().replace(**change)


def test_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**PRESETS["tiny"]().to_dict(), "n_layers": 3})
