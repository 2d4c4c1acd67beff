"""Translating with trained weights: `search` (beam search, ensembles, incremental decoding),
`translate` (the one inference loader, `load_for_inference`, and the `Translator`: text in,
text out), `quantize` (inference precision: fp32 / bf16 / int8 copies), `shortlist`
(vocabulary selection), `unk_replace` (the paper's §4.3 unknown-word replacement) and
`attention_plot`.

May import: torch, sentencepiece, matplotlib (lazily), `convs2s.config`, `convs2s.precision`,
`convs2s.model`, `convs2s.io`. Not Ray, not MLflow: a Ray task, a Ray Serve replica or an MLflow
pyfunc model wraps a `Translator` from outside.
"""
