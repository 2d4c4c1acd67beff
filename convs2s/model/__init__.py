"""The network of the paper (Gehring et al., 2017), in its order: `conv` (the convolution with
its incremental-decoding buffer), `layers` (weight-normalized linear / embedding layers and the
appendix-A initialization), `network` (encoder, decoder, multi-step attention, `ConvS2S`),
`fused` (the blocks' element-wise work as four functions, compiled on request) and `loss`
(label-smoothed cross entropy, fused with the output layer).

May import: torch, the standard library, `convs2s.config`. Nothing here knows about Ray,
MLflow, files or the search; a new model switch is a field of `config.ModelConfig` read here.
"""
