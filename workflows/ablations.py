"""The paper's analysis (§5.4-§5.6) as named sets of model variants: what a sweep varies.

A *variant* is a name and the `ModelConfig` fields it changes from the workflow preset's model;
a *sweep* is a plain function of that model returning its variants, the unchanged `baseline`
first (torchtitan-style presets: read them here, not in a registry of strings):

    table4(model)    position embeddings on / off (Table 4)
    table5(model)    multi-step attention in fewer decoder layers (Table 5)
    depth(model)     shallower and deeper encoders and decoders (§5.6, Figure 2)
    kernel(model)    other encoder and decoder kernel widths at the preset's depths (§5.6)
    table7(model)    the encoder's depth x kernel width grid: 5, 9, 13 layers x 3, 5, 7 (Table 7)
    table8(model)    the decoder's: 3, 5, 7 layers x kernel 3, 5, 7 (Table 8)
    recipe(model)    more dropout and a wider model: retuning a small-data recipe (not the paper's)

`SWEEPS` names them for `--sweep` ("paper-5.2" is Tables 4 and 5 together, the paper's §5.4 and
§5.5 whatever the name says). Each variant is derived from the preset's model, so the same sweep
fits Multi30k's 4 + 3 layers and the paper's ablation model (13 encoder layers at kernel 3, 5
decoder layers at kernel 5; `wmt14_en_de`'s `ablation` preset). The paper's own numbers (WMT'14
En-De, newstest2014, averaged over three runs) are kept beside the rows that have one: Table 4's
beside any preset's rows (the same four models), Tables 5, 7 and 8's where the preset's model has
the depths they are of (a 5-layer decoder; the ablation model for the grids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from convs2s.config import ModelConfig
from workflows.errors import SpecError

BASELINE = "baseline"


class SweepError(SpecError):
    """A sweep that cannot run as asked: the message names the flag and the fix (one `error:`
    line, exit 2, before Ray starts)."""


@dataclass(frozen=True)
class Variant:
    name: str  # a trial folder / run name part: letters, digits, dashes
    label: str  # as the paper's table says it
    changes: tuple[tuple[str, object], ...] = ()  # ModelConfig field -> value
    # the paper's (valid PPL, BLEU), where it has the row (Tables 7 and 8 give no PPL: None)
    paper: tuple[float | None, float] | None = None
    # A `custom` sweep's variant: --set settings of any section (workflows/overrides.py),
    # applied to the preset when the trial's run is resolved.
    sets: tuple[str, ...] = ()

    def apply(self, model: ModelConfig) -> ModelConfig:
        return model.replace(**dict(self.changes))

    def changed(self, model: ModelConfig) -> dict[str, str]:
        """{"model.<field>": value} for each field this variant sets to another value than the
        preset's: what the trial's MLflow run shows as its changed settings."""
        base, new = model.to_dict(), self.apply(model).to_dict()
        return {f"model.{k}": str(new[k]) for k in sorted(new) if new[k] != base.get(k)}


def _baseline(paper: tuple[float, float] | None = None) -> Variant:
    return Variant(BASELINE, "ConvS2S (the preset's model)", (), paper)


# --- Table 4: position embeddings ---------------------------------------------------------------


def table4(model: ModelConfig) -> list[Variant]:
    """Removing the source, the target or both position embeddings (§5.4, Table 4: 6.64 PPL /
    21.7 BLEU with both; both removed cost 0.5 BLEU)."""
    return [_baseline((6.64, 21.7)),
            Variant("no-src-pos", "-source position", (("src_positions", False),), (6.69, 21.3)),
            Variant("no-tgt-pos", "-target position", (("tgt_positions", False),), (6.63, 21.5)),
            Variant("no-pos", "-source & target position",
                    (("src_positions", False), ("tgt_positions", False)), (6.68, 21.2))]


# --- Table 5: multi-step attention ---------------------------------------------------------------


# Table 5's rows for the paper's 5-layer decoder: attention layers -> (valid PPL, BLEU)
TABLE5 = {(1, 2, 3, 4, 5): (6.65, 21.63), (1, 2, 3, 4): (6.70, 21.54), (1, 2, 3): (6.95, 21.36),
          (1, 2): (6.92, 21.47), (1, 3, 5): (6.97, 21.10), (1,): (7.15, 21.26),
          (2,): (7.09, 21.30), (3,): (7.11, 21.19), (4,): (7.19, 21.31), (5,): (7.66, 20.24)}


def table5(model: ModelConfig) -> list[Variant]:
    """Attention in fewer decoder layers (§5.5, Table 5; the paper: attention in every layer
    gives the best validation perplexity, and removing attention layers costs BLEU and PPL).
    For an n-layer decoder, in the table's order: layers 1..k for k = n-1 .. 1 with every
    other layer (1,3,5) before the single layer 1, then each single layer 2..n; the paper's
    numbers beside them where the decoder has its 5 layers."""
    n = len(model.decoder_layers)
    placements = [tuple(range(1, k + 1)) for k in range(n - 1, 1, -1)]
    placements += [p for p in [tuple(range(1, n + 1, 2)), (1,)] if len(p) < n]
    placements += [(i,) for i in range(2, n + 1)]
    paper = TABLE5 if n == 5 else {}
    out = [_baseline(paper.get(tuple(range(1, n + 1))))]
    for layers in dict.fromkeys(placements):
        flags = tuple(i + 1 in layers for i in range(n))
        out.append(Variant("attn-" + "-".join(map(str, layers)),
                           "attention in layer" + ("s " if len(layers) > 1 else " ")
                           + ",".join(map(str, layers)),
                           (("decoder_attention", flags),), paper.get(layers)))
    return out


# --- Figure 2 and Tables 7 and 8: depth and kernel width -----------------------------------------


def _stack(layers, depth: int, kernel: int | None = None) -> list[tuple[int, int]]:
    """`depth` layers of the stack's first width (its kernel, or `kernel`)."""
    width, k = layers[0]
    return [(width, kernel or k)] * depth


def depth(model: ModelConfig) -> list[Variant]:
    """Encoder and decoder depth (§5.6, Figure 2: deeper encoders help "until up to 9 layers
    when accuracy starts to plateau"; "decoder setups with two layers already perform well"):
    half, twice and the paper's 9 for the encoder, 1, 2 and twice the preset's depth for the
    decoder (the paper's two anchors among them), each keeping the first layer's width and
    kernel."""
    ne, nd = len(model.encoder_layers), len(model.decoder_layers)
    out = [_baseline()]
    for n in sorted({max(1, ne // 2), 9, 2 * ne} - {ne}):
        out.append(Variant(f"enc-{n}", f"{n} encoder layers",
                           (("encoder_layers", _stack(model.encoder_layers, n)),)))
    for n in sorted({1, 2, 2 * nd} - {nd}):
        out.append(Variant(f"dec-{n}", f"{n} decoder layers",
                           (("decoder_layers", _stack(model.decoder_layers, n)),
                            ("decoder_attention", None))))
    return out


def kernel(model: ModelConfig) -> list[Variant]:
    """Kernel width (§5.6: "encoders with narrow kernels and many layers perform better than
    wider kernels", a similar picture for decoders): kernels of 3, 5 and 7 in the encoder,
    then in the decoder, at the preset's depths and widths. Layers of kernel 1 (the paper's
    En-De and En-Fr models end in "linear mappings with a single input", §5.1) stay so."""
    out = [_baseline()]
    for side in ("encoder", "decoder"):
        layers = getattr(model, f"{side}_layers")
        for k in (3, 5, 7):
            if all(kw == k for _, kw in layers if kw > 1):
                continue  # the preset's own kernel: the baseline
            out.append(Variant(f"{side[:3]}-k{k}", f"{side} kernel {k}",
                               ((f"{side}_layers", [(w, k if kw > 1 else kw)
                                                    for w, kw in layers]),)))
    return out


# Tables 7 and 8 (BLEU; the other side is the ablation model's: 13 encoder layers at kernel 3,
# 5 decoder layers at kernel 5): (layers, kernel width) -> BLEU
TABLE7 = {(5, 3): 20.61, (9, 3): 21.17, (13, 3): 21.63, (5, 5): 20.80, (9, 5): 21.02,
          (13, 5): 21.42, (5, 7): 20.81, (9, 7): 21.30, (13, 7): 21.09}
TABLE8 = {(3, 3): 21.10, (5, 3): 21.71, (7, 3): 21.62, (3, 5): 21.09, (5, 5): 21.63,
          (7, 5): 21.24, (3, 7): 21.40, (5, 7): 21.31, (7, 7): 21.33}
_ABLATION = ([(512, 3)] * 13, [(512, 5)] * 5)  # the analysis model's stacks (§5.4)


def _grid(model: ModelConfig, side: str, depths: tuple[int, ...], table: dict) -> list[Variant]:
    """Every depth x kernel width (3, 5, 7) of one side, each layer of the stack's first width;
    the combination the preset already is stays the baseline. The paper's BLEU beside each
    where the preset is the paper's analysis model (the grid's other side)."""
    layers = getattr(model, f"{side}_layers")
    ours = (model.encoder_layers, model.decoder_layers) == _ABLATION
    base_key = (len(layers), layers[0][1])
    out = [_baseline((None, table[base_key]) if ours and base_key in table else None)]
    for k in (3, 5, 7):
        for n in depths:
            stack = _stack(layers, n, k)
            if stack == list(layers):
                continue  # the preset's own: the baseline
            changes = ((f"{side}_layers", stack),) + \
                ((("decoder_attention", None),) if side == "decoder" else ())
            out.append(Variant(f"{side[:3]}-{n}-k{k}", f"{n} {side} layers, kernel {k}",
                               changes, (None, table[(n, k)]) if ours else None))
    return out


def table7(model: ModelConfig) -> list[Variant]:
    """The encoder: 5, 9 and 13 layers at kernel widths 3, 5 and 7 (§5.6, Table 7: "encoders
    with narrow kernels and many layers perform better than wider kernels")."""
    return _grid(model, "encoder", (5, 9, 13), TABLE7)


def table8(model: ModelConfig) -> list[Variant]:
    """The decoder: 3, 5 and 7 layers at kernel widths 3, 5 and 7 (§5.6, Table 8: "a similar
    picture for decoder networks with large kernel sizes"); attention in every layer."""
    return _grid(model, "decoder", (3, 5, 7), TABLE8)


def paper_5_2(model: ModelConfig) -> list[Variant]:
    """Tables 4 and 5 together, one shared baseline."""
    return table4(model) + table5(model)[1:]


# --- Not the paper's: retuning a recipe for more updates per hour ------------------------------


def _widen(layers, width: int) -> list[tuple[int, int]]:
    return [(width, k) for _, k in layers]


def recipe(model: ModelConfig) -> list[Variant]:
    """Regularization and width for a small corpus seen many times (Multi30k's 29,000 captions
    pass 40-65 times in an hour at the CPU's bf16 rate): dropout +0.1 and +0.2, and 1.5x the
    convolution width with dropout +0.1 (the output embedding keeps its width, so the vocabulary
    projection costs the same); and the output projection tied to the decoder's input embedding
    (Press & Wolf 2017; the reference's `share_input_output_embed`), which takes the vocabulary
    x width table out of the parameters that 29,000 captions must fit, where the widths match."""
    d, w = model.dropout, 3 * model.embed_dim // 2
    more, most = round(d + 0.1, 2), round(d + 0.2, 2)
    tied = ([Variant("tied-output", "fc3 tied to the decoder input embedding",
                     (("share_decoder_embed", True),))]
            if model.out_embed_dim == model.embed_dim and not model.share_decoder_embed else [])
    return [_baseline(),
            Variant(f"dropout-{more:g}", f"dropout {more:g}", (("dropout", more),)),
            Variant(f"dropout-{most:g}", f"dropout {most:g}", (("dropout", most),)),
            Variant(f"wide-{w}", f"width {w}, dropout {more:g}",
                    (("embed_dim", w), ("encoder_layers", _widen(model.encoder_layers, w)),
                     ("decoder_layers", _widen(model.decoder_layers, w)), ("dropout", more))),
            *tied]


SWEEPS: dict[str, Callable[[ModelConfig], list[Variant]]] = {
    "paper-5.2": paper_5_2, "table4": table4, "table5": table5, "depth": depth,
    "kernel": kernel, "table7": table7, "table8": table8, "recipe": recipe,
}


CUSTOM = "custom"  # --sweep custom --variant NAME:SETTING;SETTING ...: variants as --set lists
# Settings a sweep sets for every trial itself, whatever the preset or --set said (each trial
# scores its best checkpoint alone: the sweep's seeds are its runs): refused in --set with
# --sweep, where they would be listed as applied and replaced unseen
TRIAL_OWNED = {"ensemble.runs": "a trial is one run; --seeds N gives each variant N runs",
               "ensemble.average_last": "a trial scores its best checkpoint alone"}
# ... and in a variant also the seed: the sweep's --set train.seed is its first seed (seeds
# seed, seed+1, ...), a variant's would be replaced by the sweep's
SWEEP_OWNED = {"train.seed": "--seeds N trains seeds seed, seed+1, ...", **TRIAL_OWNED}
# ... and a trial's resources: the sweep checks the GPUs and counts how many trials fit at once
# from its own (sweep.concurrency), which a variant's would outgrow unseen
_RESOURCES = ("a trial's resources are the sweep's: --num-workers, --use-gpu, "
              "--accelerator-type and --set workflow.cpus_per_worker / eval_cpus / eval_gpus "
              "apply to every trial")
SWEEP_OWNED.update({f"workflow.{name}": _RESOURCES for name in
                    ("num_workers", "use_gpu", "cpus_per_worker", "accelerator_type",
                     "eval_cpus", "eval_gpus")})
# ... and the budget: every trial trains as long as every other (the summary states one budget
# for all, and a variant given more training is compared with less)
SWEEP_OWNED.update({f"train.{name}": "every trial trains for the sweep's budget (--max-time, "
                    "--max-updates, --max-epochs, or --set for the whole sweep)"
                    for name in ("max_time", "max_updates", "max_epochs")})


def trial_owned_problem(sweep: str, changes) -> str | None:
    """Why settings given to a whole sweep (`changes`: its --set and --config file's
    workflows.overrides changes) cannot apply, or None: the sweep sets those for every trial
    itself."""
    owned = [c for c in changes if f"{c.section}.{c.field}" in TRIAL_OWNED]
    if not owned:
        return None
    given = ", ".join(f"{c.origin} {c.text}" for c in owned)
    why = "; ".join(dict.fromkeys(f"{c.section}.{c.field}: "
                                  f"{TRIAL_OWNED[f'{c.section}.{c.field}']}" for c in owned))
    return (f"--sweep {sweep}: {given}: the sweep sets {'this' if len(owned) == 1 else 'these'} "
            f"for every trial ({why}); leave {'it' if len(owned) == 1 else 'them'} out")


def custom_variants(specs: list[str]) -> list[Variant]:
    """`--variant NAME:SECTION.FIELD=VALUE[;...]` (repeatable) -> the baseline and a variant
    each, its settings applied like --set; a SweepError names a malformed one."""
    if not specs:
        raise SweepError(f"--sweep {CUSTOM}: give its variants, e.g. --variant "
                         "'lr-half:train.lr=0.125' --variant 'drop-0.3:model.dropout=0.3'")
    out, seen = [_baseline()], {BASELINE}
    for spec in specs:
        name, colon, rest = spec.partition(":")
        sets = tuple(s.strip() for s in rest.split(";") if s.strip())
        if not colon or not name or not sets \
                or not all(c.isalnum() or c in "-." for c in name):
            raise SweepError(f"--variant {spec!r}: write NAME:SECTION.FIELD=VALUE[;...] with a "
                             "name of letters, digits, '-' and '.' (e.g. lr-half:train.lr=0.125)")
        if name in seen:
            raise SweepError(f"--variant {name}: two variants share this name")
        owned = [x for x in sets if x.split("=", 1)[0].strip() in SWEEP_OWNED]
        if owned:  # (set by the sweep for every trial: a variant's would be replaced unseen)
            key = owned[0].split("=", 1)[0].strip()
            raise SweepError(f"--variant {name}: {key} is the sweep's own ({SWEEP_OWNED[key]}), "
                             "the same for every variant")
        seen.add(name)
        out.append(Variant(name, "; ".join(sets), sets=sets))
    return out


def variants_for(sweep: str, model: ModelConfig, only: list[str] | None = None) -> list[Variant]:
    """The variants of `sweep` for the preset's `model` (`only`: a subset by name, in the
    sweep's order). Each must build a valid model that differs from the baseline and from the
    others; a SweepError names what does not."""
    if sweep not in SWEEPS:
        raise SweepError(f"--sweep {sweep!r}: no such sweep; choose one of "
                         f"{', '.join(sorted(SWEEPS))}")
    variants = SWEEPS[sweep](model)
    if only:
        names = [v.name for v in variants]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise SweepError(f"--variants {','.join(unknown)}: not a variant of the "
                             f"{sweep!r} sweep for this preset; choose from {', '.join(names)}")
        variants = [v for v in variants if v.name in only]
    seen: dict[str, str] = {}
    for v in variants:
        try:
            built = v.apply(model)
        except ValueError as err:
            raise SweepError(f"sweep {sweep!r}, variant {v.name}: {err}") from None
        if v.name != BASELINE and not v.changed(model):
            raise SweepError(f"sweep {sweep!r}, variant {v.name}: it changes nothing in this "
                             "preset's model (it already has those settings); leave it out "
                             "with --variants")
        key = repr(built.to_dict())
        if key in seen:
            raise SweepError(f"sweep {sweep!r}: variants {seen[key]} and {v.name} build the "
                             "same model; keep one with --variants")
        seen[key] = v.name
    return variants
