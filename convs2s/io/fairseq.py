"""The reference implementation's `fconv` checkpoints in and out: the paper's published models
(`wmt14.v2.en-fr.fconv-py`, `wmt14.en-de.fconv-py`, `wmt17.v2.en-de.fconv-py`) load here,
and our checkpoints export to its `model.pt` and dictionaries, which `fairseq-generate` reads
(an imported model's export, with its bpecodes, also loads in the hub loader; a sentencepiece
model's export holds `sentencepiece.model`, which the hub does not find by itself: give it
`bpe="sentencepiece", sentencepiece_model=<that file>`).

    ckpt = import_fairseq("wmt14.v2.en-fr.fconv-py", "runs/imported/en-fr")   # a checkpoint dir
    export_fairseq("runs/demo/best", "exported/")                             # model.pt + dicts

An archive folder holds `model.pt`, `dict.<src>.txt`, `dict.<tgt>.txt` and `bpecodes` (the
layout the reference's hub loader reads). Import writes a checkpoint directory of this project
(`checkpoint.pt`, `meta.json`) plus the archive's text files and `text.json`, which tells the
translator to use Moses tokenization + subword-nmt BPE with those dictionaries
(`convs2s.io.text_codec`) instead of a sentencepiece model.

- **Safe loading.** The reference pickles its settings (an `argparse.Namespace`, or a plain
  dict of them in newer versions) beside the tensors. `model.pt` is read with torch's
  weights-only unpickler and an allowlist of exactly those types; anything else (possibly
  code) is refused with the name of the type, never loaded.
- **The model config comes from the checkpoint's own arguments**: the architecture name's
  defaults (our table of the reference's `fconv*` architectures) overridden by the saved
  values; layer strings such as "[(512, 3)] * 9 + [(1024, 3)] * 4" are read by a literal
  evaluator (lists, tuples, numbers, `+`, `*`), never `eval`.
- **Weights.** Token tables and position tables (the same layout: row 1 the padding row,
  positions from 2) copy over; weight-normed layers map gain / direction pairs: linear
  layers share our layout, `ConvTBC` directions (kernel, in, out) are permuted to our
  (out, kernel, in); a decoder saved before the reference's weight-norm fix
  (`decoder.version` < 2, gains per kernel position) is folded to its effective weights and
  re-normalized per output channel, which computes the same function. A key or shape that
  does not fit is one `FairseqImportError` naming it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
from pathlib import Path

import torch

from convs2s.config import PAD, ModelConfig
# (WRITTEN_BY, PUBLISHING, COMMANDS: the folders' records, named here too)
from convs2s.io.interop_folders import (COMMANDS, PUBLISHING, WRITTEN_BY,  # noqa: F401
                                        _check_out, _input_and_out, _whole_folder)
from convs2s.io.text_codec import BPE_CODES, TEXT_FILE, CodecError, read_dictionary
from storage import StorageError, local_copy

ARCHIVE_MODEL = "model.pt"
# A language code as the reference's archives name their dictionaries (en, fr, en_XX, zh-Hant):
# it becomes part of a file name (dict.<lang>.txt), so nothing else is taken from a model.pt
_LANG = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8}){0,3}")
# subword-nmt codes: an optional "#version: ..." line, then one merge ("a b") a line; the
# reference's are about 40k lines, under 1 MB
BPE_CODES_MAX_BYTES = 64 << 20

# The reference's fconv architectures: name -> the defaults its registry fills in (the saved
# arguments override them). Layer strings are as the reference writes them.
_BASE = {"encoder_embed_dim": 512, "encoder_layers": "[(512, 3)] * 20",
         "decoder_embed_dim": 512, "decoder_layers": "[(512, 3)] * 20",
         "decoder_out_embed_dim": 256, "decoder_attention": "True",
         "share_input_output_embed": False, "dropout": 0.1,
         "max_source_positions": 1024, "max_target_positions": 1024}
_EN_DE = "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"
_EN_FR = "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1"
ARCHITECTURES: dict[str, dict] = {
    "fconv": {},
    "fconv_iwslt_de_en": {"encoder_embed_dim": 256, "encoder_layers": "[(256, 3)] * 4",
                          "decoder_embed_dim": 256, "decoder_layers": "[(256, 3)] * 3",
                          "decoder_out_embed_dim": 256},
    "fconv_wmt_en_ro": {"decoder_out_embed_dim": 512},
    "fconv_wmt_en_de": {"encoder_embed_dim": 768, "encoder_layers": _EN_DE,
                        "decoder_embed_dim": 768, "decoder_layers": _EN_DE,
                        "decoder_out_embed_dim": 512},
    "fconv_wmt_en_fr": {"encoder_embed_dim": 768, "encoder_layers": _EN_FR,
                        "decoder_embed_dim": 768, "decoder_layers": _EN_FR,
                        "decoder_out_embed_dim": 512},
}


class FairseqImportError(ValueError):
    """An archive or checkpoint of the reference that cannot be imported; says which file or
    key and why."""


# --- reading a reference checkpoint safely --------------------------------------------------------


def read_reference_checkpoint(path: str | Path) -> dict:
    """The reference's checkpoint dict, read with torch's weights-only unpickler: tensors,
    containers, numbers, strings and `argparse.Namespace` (its saved arguments) only."""
    import pickle

    path = Path(path)
    if not path.is_file():
        raise FairseqImportError(f"{path} does not exist: an archive folder of the reference "
                                 f"holds {ARCHIVE_MODEL}, dict.<src>.txt, dict.<tgt>.txt and "
                                 f"{BPE_CODES}")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        what = next((line.strip() for line in str(err).splitlines()
                     if "GLOBAL" in line or "Unsupported" in line), str(err).splitlines()[0])
        raise FairseqImportError(
            f"{path} was refused: it holds a pickled object outside the allowlist of a "
            f"reference checkpoint (tensors, containers, argparse.Namespace): {what[:200]}; "
            "loading it could run code, so it is not loaded") from None
    except MemoryError:  # (not the file's fault: said as itself)
        raise
    except Exception as err:  # noqa: BLE001 - damaged bytes raise whatever the objects they
        # build do (IndexError, KeyError: the unpickler's; TypeError, AttributeError: torch's
        # rebuild functions given other objects)
        raise FairseqImportError(f"{path} is not a readable checkpoint (truncated, damaged or "
                                 f"of another format: {type(err).__name__}); download or copy "
                                 "it again") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise FairseqImportError(f"{path} holds no 'model' weights: not a checkpoint of the "
                                 "reference implementation")
    bad = next((k for k, v in state["model"].items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise FairseqImportError(f"{path}: weight {bad!r} is not a tensor: a damaged "
                                 "checkpoint; download or copy it again")
    return state


def saved_arguments(state: dict, path: Path) -> dict:
    """The model's saved settings as a plain dict: `args` (a Namespace, older versions) or the
    `model` section of `cfg` (newer versions, a dict)."""
    args = state.get("args")
    if isinstance(args, argparse.Namespace):
        return vars(args)
    cfg = state.get("cfg")
    if isinstance(cfg, dict):
        model = cfg.get("model")
        if isinstance(model, argparse.Namespace):
            return vars(model)
        if isinstance(model, dict):
            task = cfg.get("task") or {}
            merged = dict(model)
            for k in ("source_lang", "target_lang"):  # the task holds the languages
                merged.setdefault(k, task.get(k) if isinstance(task, dict) else None)
            return merged
    raise FairseqImportError(f"{path}: no saved arguments ('args' or 'cfg.model'): the model "
                             "config cannot be known without guessing")


# --- the model config ----------------------------------------------------------------------------


def _literal(text: str, what: str, path: Path):
    """A layer / attention expression of the reference ("[(512, 3)] * 9 + [(1024, 3)] * 4",
    "[True, False]", "True") evaluated over literals, +, * only."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Mult):  # bounded before any list is built
                seq, n = (a, b) if isinstance(a, (list, tuple)) else (b, a)
                if not isinstance(seq, (list, tuple)):  # two numbers
                    if max(abs(a), abs(b)) > 10**9:
                        raise ValueError("a number above 10**9")
                    return a * b
                if not isinstance(n, int) or isinstance(n, bool):  # (a list times a list:
                    raise ValueError("a list repeated by a non-integer")  # never computed)
                if len(seq) * n > MAX_LAYER_ITEMS:
                    raise ValueError(f"a repeat of {len(seq) * n} exceeds {MAX_LAYER_ITEMS}")
                return a * b
            if isinstance(a, (list, tuple)) and len(a) + len(b) > MAX_LAYER_ITEMS:
                raise ValueError(f"more than {MAX_LAYER_ITEMS} items")
            return a + b
        raise ValueError(f"unsupported expression {ast.dump(node)[:80]}")
    if len(str(text)) > MAX_EXPRESSION_CHARS:
        raise FairseqImportError(f"{path}: {what} is {len(str(text))} characters long, more "
                                 "than a layer expression of the reference "
                                 f"({MAX_EXPRESSION_CHARS})")
    try:
        return ev(ast.parse(str(text).strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, RecursionError) as err:
        raise FairseqImportError(f"{path}: {what} = {text!r} is not a layer expression of the "
                                 f"reference ({err})") from None


# Bounds on what a saved architecture may ask for, checked before any tensor is made: ten
# times the paper's largest model in every dimension (docs/design.md, hostile inputs).
MAX_LAYER_ITEMS = 1000  # entries a layer expression may build (the paper's deepest: 20)
MAX_EXPRESSION_CHARS = 10_000  # the paper's longest is under 100
MAX_LAYERS, MAX_CHANNELS, MAX_KERNEL = 200, 40_960, 31
MAX_EMBED, MAX_POSITIONS = 40_960, 65_536


def _layers(text: str, what: str, path: Path) -> list[tuple[int, int]]:
    spec = _literal(text, what, path)
    out = []
    if isinstance(spec, list) and len(spec) > MAX_LAYERS:
        raise FairseqImportError(f"{path}: {what} has {len(spec)} layers, more than "
                                 f"{MAX_LAYERS}")
    for layer in spec if isinstance(spec, list) else []:
        if not isinstance(layer, tuple) or len(layer) not in (2, 3) or \
                not all(isinstance(v, int) for v in layer):
            raise FairseqImportError(f"{path}: {what} layer {layer!r} is not (channels, kernel)")
        if not (0 < layer[0] <= MAX_CHANNELS and 0 < layer[1] <= MAX_KERNEL):
            raise FairseqImportError(f"{path}: {what} layer {layer!r} is outside (1..."
                                     f"{MAX_CHANNELS} channels, 1...{MAX_KERNEL} kernel)")
        if len(layer) == 3 and layer[2] != 1:
            raise FairseqImportError(f"{path}: {what} layer {layer!r} takes its residual from "
                                     f"{layer[2]} layers back; this model has residuals from "
                                     "the previous layer only (the paper's)")
        out.append((layer[0], layer[1]))
    if not out:
        raise FairseqImportError(f"{path}: {what} = {text!r} names no layers")
    return out


def model_config(args: dict, path: Path) -> tuple[ModelConfig, dict]:
    """(ModelConfig, languages) from the saved arguments: the architecture's defaults, then
    every saved value."""
    arch = args.get("arch") or args.get("_name")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise FairseqImportError(f"{path}: architecture {arch!r} is not a convolutional "
                                 f"sequence-to-sequence model this project imports ({known})")
    a = {**_BASE, **ARCHITECTURES[arch],
         **{k: v for k, v in args.items() if k in _BASE and v is not None}}
    if a["encoder_embed_dim"] != a["decoder_embed_dim"]:
        raise FairseqImportError(f"{path}: encoder and decoder embeddings differ "
                                 f"({a['encoder_embed_dim']} / {a['decoder_embed_dim']}); "
                                 "this model has one embedding size")
    if a["max_source_positions"] != a["max_target_positions"]:
        raise FairseqImportError(f"{path}: source and target position tables differ "
                                 f"({a['max_source_positions']} / {a['max_target_positions']})")
    for key, bound in (("encoder_embed_dim", MAX_EMBED), ("decoder_out_embed_dim", MAX_EMBED),
                       ("max_source_positions", MAX_POSITIONS)):
        if not isinstance(a[key], int) or not 0 < a[key] <= bound:
            raise FairseqImportError(f"{path}: {key} = {a[key]!r} is outside 1...{bound}")
    decoder = _layers(a["decoder_layers"], "decoder_layers", path)
    attention = _literal(a["decoder_attention"], "decoder_attention", path)
    if isinstance(attention, bool):
        attention = (attention,) * len(decoder)
    elif not (isinstance(attention, (list, tuple)) and len(attention) == len(decoder)
              and all(isinstance(x, bool) for x in attention)):
        raise FairseqImportError(f"{path}: decoder_attention = {a['decoder_attention']!r} is "
                                 f"neither True / False nor one of them for each of the "
                                 f"{len(decoder)} decoder layers")
    encoder = _layers(a["encoder_layers"], "encoder_layers", path)
    try:
        cfg = ModelConfig(embed_dim=int(a["encoder_embed_dim"]), encoder_layers=encoder,
                          decoder_layers=decoder, out_embed_dim=int(a["decoder_out_embed_dim"]),
                          dropout=float(a["dropout"]),
                          # the reference's table has max_positions rows, padding row and the
                          # unused row 0 included; ours has max_positions + 2
                          max_positions=int(a["max_source_positions"]) - PAD - 1,
                          decoder_attention=None if all(attention) else tuple(attention),
                          share_decoder_embed=bool(a["share_input_output_embed"]))
    except (TypeError, ValueError) as err:  # dropout 1.5, a dropout that is no number, ...
        raise FairseqImportError(f"{path}: the saved arguments give no valid model: {err}"
                                 ) from None
    langs = {"source_lang": args.get("source_lang"), "target_lang": args.get("target_lang")}
    return cfg, langs


# --- weights -------------------------------------------------------------------------------------


def layer_names(cfg: ModelConfig) -> list[tuple[str, str, str]]:
    """(kind, the reference's prefix, ours) of every layer with weights, in model order. Kinds:
    "table" (token / position embeddings: `.weight`), "linear" (weight-normed linear layer),
    "conv" (weight-normed convolution), "tied" (fc3 sharing the decoder's token table: only
    its bias is its own). The one place the two naming schemes meet (import and export)."""
    out = []
    for side, layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        out += [("table", f"{side}.embed_tokens", f"{side}.embed_tokens"),
                ("table", f"{side}.embed_positions", f"{side}.embed_positions"),
                ("linear", f"{side}.fc1", f"{side}.fc1")]
        width = layers[0][0]
        for i, (channels, _) in enumerate(layers):
            if width != channels:  # the residual needs a projection to the new width
                out.append(("linear", f"{side}.projections.{i}", f"{side}.blocks.{i}.proj"))
            out.append(("conv", f"{side}.convolutions.{i}", f"{side}.blocks.{i}.conv"))
            if side == "decoder" and (cfg.decoder_attention is None or cfg.decoder_attention[i]):
                out += [("linear", f"decoder.attention.{i}.in_projection",
                         f"decoder.blocks.{i}.attention.in_proj"),
                        ("linear", f"decoder.attention.{i}.out_projection",
                         f"decoder.blocks.{i}.attention.out_proj")]
            width = channels
        out.append(("linear", f"{side}.fc2", f"{side}.fc2"))
    out.append(("tied" if cfg.share_decoder_embed else "linear", "decoder.fc3", "decoder.fc3"))
    return out


def _norm_except(w: torch.Tensor, dim: int) -> torch.Tensor:
    """||w|| over every dimension but `dim`, shaped to broadcast against w."""
    dims = [d for d in range(w.dim()) if d != dim]
    return w.norm(dim=dims, keepdim=True)


def _effective(g: torch.Tensor, v: torch.Tensor, dim: int) -> torch.Tensor:
    return v * (g / _norm_except(v, dim))


def convert_weights(fs: dict, cfg: ModelConfig, path: Path) -> dict[str, torch.Tensor]:
    """Our state dict from the reference's fconv state dict."""
    fs = {k: v for k, v in fs.items() if torch.is_tensor(v)}
    used: set[str] = set()
    out: dict[str, torch.Tensor] = {}

    def take(key: str) -> torch.Tensor:
        if key not in fs:
            raise FairseqImportError(f"{path}: the weights lack {key!r} that the saved "
                                     "architecture implies")
        used.add(key)
        return fs[key].float()

    def linear(src: str, dst: str) -> None:
        out[f"{dst}.parametrizations.weight.original0"] = take(f"{src}.weight_g")
        out[f"{dst}.parametrizations.weight.original1"] = take(f"{src}.weight_v")
        out[f"{dst}.bias"] = take(f"{src}.bias")

    def conv(src: str, dst: str, old_norm: bool) -> None:
        g, v = take(f"{src}.weight_g"), take(f"{src}.weight_v")  # v: kernel x in x out
        if v.dim() != 3:
            raise FairseqImportError(f"{path}: {src}.weight_v has shape {tuple(v.shape)}, not "
                                     "(kernel, in, out): not a convolution of fconv")
        # the gains' shape for the weight norm the decoder's version says (the reference
        # refuses a file whose gains are of the other kind; folded as the other kind they
        # made a model that loads and computes another function)
        want = (v.shape[0], 1, 1) if old_norm else (1, 1, v.shape[2])
        if tuple(g.shape) != want:
            raise FairseqImportError(
                f"{path}: {src}.weight_g has shape {tuple(g.shape)}, but the weight norm "
                f"{'before' if old_norm else 'after'} the reference's fix (decoder.version "
                f"{'< 2' if old_norm else '>= 2'}, or the gains' shape where there is no "
                f"version) has {want}: a checkpoint whose version and weights disagree")
        if old_norm:  # gains per kernel position: fold, then one gain per output channel
            w = _effective(g, v, 0).permute(2, 0, 1)
            g, v = _norm_except(w, 0), w
        else:
            g, v = g.reshape(-1, 1, 1), v.permute(2, 0, 1)
        out[f"{dst}.parametrizations.weight.original0"] = g.contiguous()
        out[f"{dst}.parametrizations.weight.original1"] = v.contiguous()
        out[f"{dst}.bias"] = take(f"{src}.bias")

    version = fs.get("decoder.version")
    if version is not None:
        if not version.numel():
            raise FairseqImportError(f"{path}: decoder.version is empty: a damaged checkpoint")
        old_decoder = float(version.flatten()[0]) < 2
    else:  # no version buffer: tell by the gains' shape ((kernel, 1, 1) before the fix)
        g0 = fs.get("decoder.convolutions.0.weight_g")
        old_decoder = g0 is not None and g0.shape[-1] == 1 and cfg.decoder_layers[0][0] > 1
    used.update(k for k in ("decoder.version", "encoder.version") if k in fs)
    for kind, ref, ours in layer_names(cfg):
        if kind == "table":
            out[f"{ours}.weight"] = take(f"{ref}.weight")
        elif kind == "linear":
            linear(ref, ours)
        elif kind == "conv":
            conv(ref, ours, old_decoder and ref.startswith("decoder."))
        else:  # tied: the token table's rows are the output weights
            out[f"{ours}.weight"] = out["decoder.embed_tokens.weight"]
            used.add(f"{ref}.weight")
            out[f"{ours}.bias"] = take(f"{ref}.bias")
    left = sorted(set(fs) - used)
    if left:
        raise FairseqImportError(f"{path}: weights {left[:5]} have no place in the saved "
                                 "architecture (another model, or arguments that disagree "
                                 "with the weights)")
    return out


# --- import / export (their folders: convs2s.io.interop_folders) -------------------------------

def _inside(archive: Path, name: str) -> None:
    """Refuse an archive file that is a link to a file outside the archive folder: an
    unpacked download's `bpecodes -> ~/.ssh/id_rsa` would be read, copied into the checkpoint
    and published with it."""
    path = archive / name
    if path.is_symlink() and not path.resolve().is_relative_to(archive.resolve()):
        raise FairseqImportError(f"{path} links to {path.resolve()}, outside the archive "
                                 "folder: copy the file into the folder to import it")


def _check_bpe_codes(path: Path) -> None:
    """The archive's bpecodes are subword-nmt merges (copied into the checkpoint as they are,
    and read at translation time): a file of another kind is refused here, naming its line."""
    size = path.stat().st_size
    if size > BPE_CODES_MAX_BYTES:
        raise FairseqImportError(f"{path}: {size:,} bytes, more than subword-nmt codes hold "
                                 f"(the reference's are under 1 MB; at most "
                                 f"{BPE_CODES_MAX_BYTES >> 20} MiB here): not BPE codes")
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if n == 1 and line.startswith("#version"):
                continue
            if len(line.split()) != 2:
                raise FairseqImportError(f"{path}:{n}: expected a merge of two symbols "
                                         f"('a b'), got {line.strip()[:60]!r}: "
                                         "not subword-nmt codes")


def import_fairseq(archive: str | Path, out: str | Path, source_lang: str | None = None,
                   target_lang: str | None = None) -> Path:
    """Write a checkpoint directory of this project from a reference archive folder. Nothing
    is written unless everything checks out."""
    from convs2s.io.checkpoint import save_checkpoint
    from convs2s.model.network import ConvS2S
    from convs2s.io.text_codec import MOSES_BPE, codec_settings

    # A bucket's archive: its local copy; a bucket --out: published there (_whole_folder).
    try:
        archive, out = _input_and_out(archive, out, "archive folder")
        archive = local_copy(archive)  # (a local path, a file:// URI's, or a bucket's copy)
    except StorageError as err:  # (a URI that cannot be used: one line, like the others)
        raise FairseqImportError(str(err)) from None
    if not archive.is_dir():
        raise FairseqImportError(f"{archive} is not a folder: give the unpacked archive "
                                 f"(model.pt, dict.<src>.txt, dict.<tgt>.txt, {BPE_CODES})")
    model_file = archive / ARCHIVE_MODEL
    state = read_reference_checkpoint(model_file)
    args = saved_arguments(state, model_file)
    cfg, langs = model_config(args, model_file)
    src = source_lang or langs["source_lang"]
    tgt = target_lang or langs["target_lang"]
    if not src or not tgt:
        raise FairseqImportError(f"{model_file}: the saved arguments name no languages; give "
                                 "--source-lang and --target-lang")
    for flag, lang, given in (("--source-lang", src, source_lang),
                              ("--target-lang", tgt, target_lang)):
        if not isinstance(lang, str) or not _LANG.fullmatch(lang):
            said = f"{flag} {lang!r}" if given else \
                f"{model_file}: its saved {flag[2:].replace('-', '_')} {str(lang)[:80]!r}"
            raise FairseqImportError(f"{said} is not a language code (en, fr, en_XX): the "
                                     f"dictionaries are dict.<lang>.txt; give {flag}")
    if not (archive / BPE_CODES).is_file():
        spm_export = (archive / "sentencepiece.model").is_file()
        raise FairseqImportError(f"{archive / BPE_CODES} is missing: the subword-nmt codes the "
                                 "model's vocabulary was made with" + (
                                     "; this folder holds a sentencepiece.model instead (an "
                                     "export-fairseq of a model of this project, whose own "
                                     "checkpoint folder is what translates: import takes "
                                     "the reference's subword-nmt archives only)"
                                     if spm_export else ""))
    for name in (f"dict.{src}.txt", f"dict.{tgt}.txt", BPE_CODES):
        _inside(archive, name)
    _check_bpe_codes(archive / BPE_CODES)
    try:
        dicts = {lang: read_dictionary(archive / f"dict.{lang}.txt") for lang in (src, tgt)}
    except CodecError as err:
        raise FairseqImportError(str(err)) from None
    fs = state["model"]
    for side, lang in (("encoder", src), ("decoder", tgt)):
        rows = fs.get(f"{side}.embed_tokens.weight")
        if rows is not None and not torch.is_tensor(rows):
            raise FairseqImportError(f"{model_file}: its {side}.embed_tokens.weight is a "
                                     f"{type(rows).__name__}, not a tensor: not a checkpoint "
                                     "of the reference implementation")
        if rows is not None and rows.shape[0] != len(dicts[lang]):
            raise FairseqImportError(
                f"{archive / f'dict.{lang}.txt'} has {len(dicts[lang])} symbols (the 4 "
                f"specials included) but {side}.embed_tokens has {rows.shape[0]} rows: the "
                "dictionary is not the model's")
    weights = convert_weights(fs, cfg, model_file)
    model = ConvS2S(cfg, len(dicts[src]), len(dicts[tgt]))
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        first = str(err).splitlines()[1:2] or [str(err)[:200]]
        raise FairseqImportError(f"{model_file}: the weights do not fit the saved "
                                 f"architecture: {first[0].strip()[:300]}") from None
    updates = 0
    for entry in state.get("optimizer_history") or []:
        if isinstance(entry, dict) and isinstance(entry.get("num_updates"), int):
            updates = entry["num_updates"]
    with _whole_folder(out, "import-fairseq") as tmp:
        save_checkpoint(tmp, {"model": model.state_dict(), "model_config": cfg.to_dict(),
                              "src_vocab_size": len(dicts[src]),
                              "tgt_vocab_size": len(dicts[tgt]), "epoch": 0, "update": updates,
                              "imported_from": {"kind": "fairseq fconv", "archive": str(archive),
                                                "arch": args.get("arch") or args.get("_name")}})
        for lang in (src, tgt):
            shutil.copyfile(archive / f"dict.{lang}.txt", tmp / f"dict.{lang}.txt")
        shutil.copyfile(archive / BPE_CODES, tmp / BPE_CODES)
        (tmp / TEXT_FILE).write_text(json.dumps(codec_settings(MOSES_BPE, src, tgt), indent=1))
    return out


def export_fairseq(checkpoint: str | Path, out: str | Path) -> Path:
    """A reference archive folder (model.pt with its arguments, dict.<src>.txt,
    dict.<tgt>.txt, and bpecodes or sentencepiece.model) from a checkpoint directory."""
    from convs2s.io.checkpoint import SPM_FILE, load_checkpoint
    from convs2s.io.text_codec import checkpoint_folder, local_checkpoint, read_codec_settings

    checkpoint, out = _input_and_out(checkpoint, out, "checkpoint")
    checkpoint = checkpoint_folder(local_checkpoint(checkpoint))  # (its checkpoint.pt: the folder)
    state = load_checkpoint(checkpoint)
    cfg = ModelConfig.from_dict(state["model_config"])
    if not (cfg.src_positions and cfg.tgt_positions):
        raise ValueError(f"{checkpoint}: a model without position embeddings (paper Table 4's "
                         "ablation) has no fconv counterpart: the reference always adds them")
    text = read_codec_settings(checkpoint)
    src, tgt = (text["source_lang"], text["target_lang"]) if text else ("src", "tgt")
    ours = state["model"]
    fs: dict[str, torch.Tensor] = {"decoder.version": torch.tensor([2.0])}

    for kind, ref, our in layer_names(cfg):
        if kind == "table":
            fs[f"{ref}.weight"] = ours[f"{our}.weight"]
        elif kind == "tied":
            fs[f"{ref}.weight"] = ours["decoder.embed_tokens.weight"]
            fs[f"{ref}.bias"] = ours[f"{our}.bias"]
        else:
            g = ours[f"{our}.parametrizations.weight.original0"]
            v = ours[f"{our}.parametrizations.weight.original1"]
            if kind == "conv":  # ours (out, kernel, in) -> ConvTBC (kernel, in, out)
                g, v = g.reshape(1, 1, -1), v.permute(1, 2, 0)
            fs[f"{ref}.weight_g"], fs[f"{ref}.weight_v"] = g.contiguous(), v.contiguous()
            fs[f"{ref}.bias"] = ours[f"{our}.bias"]
    layers = {side: " + ".join(f"[({c}, {k})]" for c, k in getattr(cfg, f"{side}_layers"))
              for side in ("encoder", "decoder")}
    attention = "True" if cfg.decoder_attention is None else str(list(cfg.decoder_attention))
    args = argparse.Namespace(
        arch="fconv", task="translation", source_lang=src, target_lang=tgt,
        encoder_embed_dim=cfg.embed_dim, decoder_embed_dim=cfg.embed_dim,
        encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
        decoder_out_embed_dim=cfg.out_embed_dim, decoder_attention=attention,
        share_input_output_embed=cfg.share_decoder_embed, dropout=cfg.dropout,
        encoder_embed_path=None, decoder_embed_path=None,
        max_source_positions=cfg.max_positions + PAD + 1,
        max_target_positions=cfg.max_positions + PAD + 1,
        left_pad_source=True, left_pad_target=False, criterion="cross_entropy",
        optimizer="nag", lr=[0.25], momentum=0.99, weight_decay=0.0, clip_norm=0.1,
        lr_scheduler="fixed", seed=1, data=str(out))
    # The reference builds the model from its dictionaries' lengths (the 4 special symbols and
    # a line each): dictionaries of other sizes than the weights' tables were exported
    # and then failed in the reference's load, a size mismatch
    rows = {"source": ours["encoder.embed_tokens.weight"].shape[0],
            "target": ours["decoder.embed_tokens.weight"].shape[0]}
    if text:  # imported: the archive's own dictionaries
        sizes = {side: len(read_dictionary(checkpoint / f"dict.{lang}.txt"))
                 for side, lang in (("source", src), ("target", tgt))}
        sp = None
    else:
        from convs2s.io.text_codec import SentencePieceCodec

        sp = SentencePieceCodec.from_bytes((checkpoint / SPM_FILE).read_bytes(),
                                           str(checkpoint / SPM_FILE)).sp
        sizes = dict.fromkeys(rows, sp.get_piece_size())
    for side in rows:
        if sizes[side] != rows[side]:
            raise ValueError(f"{checkpoint}: its {side} vocabulary has {sizes[side]:,} entries "
                             f"but the model's {side} embedding {rows[side]:,} rows: the text "
                             "files are not this model's; export a checkpoint folder as "
                             "training or import-fairseq wrote it")
    with _whole_folder(out, "export-fairseq") as tmp:
        torch.save({"args": args, "model": {k: v.clone() for k, v in fs.items()},
                    "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                           "optimizer_name": "FairseqNAG",
                                           "lr_scheduler_state": {"best": None},
                                           "num_updates": int(state.get("update", 0))}],
                    "extra_state": {}, "last_optimizer_state": None}, tmp / ARCHIVE_MODEL)
        if text:  # imported: the archive's own dictionaries and codes
            for lang in (src, tgt):
                shutil.copyfile(checkpoint / f"dict.{lang}.txt", tmp / f"dict.{lang}.txt")
            shutil.copyfile(checkpoint / BPE_CODES, tmp / BPE_CODES)
        else:  # sentencepiece: one joint vocabulary, written as both dictionaries
            lines = "".join(f"{sp.id_to_piece(i)} 1\n" for i in range(4, sp.get_piece_size()))
            for lang in (src, tgt):
                (tmp / f"dict.{lang}.txt").write_text(lines, encoding="utf-8")
            shutil.copyfile(checkpoint / SPM_FILE, tmp / SPM_FILE)
    return out
