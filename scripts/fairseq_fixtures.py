"""Make tests/fixtures/fairseq/ with the reference implementation (run by
scripts/fairseq_fixtures.sh inside a scratch virtual environment that has fairseq; this project
never imports fairseq).

From a slice of Multi30k (../shared/data/multi30k): Moses tokenization and subword-nmt BPE as
the reference's hub interface does them, `fairseq-preprocess` (a dictionary per language, as
in the published archives), then two small models trained for a few updates with
`fairseq-train`:

- `iwslt`: the `fconv_iwslt_de_en` architecture with smaller widths (a small fixture);
- `mixed`: `fconv` with explicit layer strings: mixed widths (residual projections), a
  kernel-1 layer, kernel 5, attention in some decoder layers only, tied output embedding.

Each lands in the layout of a published archive (model.pt, dict.en.txt, dict.de.txt,
bpecodes) with what the reference itself computes on it:
- `logprobs.pt`: per sentence the source ids, the decoder input, the target and the model's
  log-probabilities (teacher forcing, eval mode), tensors only (loads with weights_only);
- `generate.json`: `fairseq-generate --beam 5` on the binarized test split: per sentence the
  source ids, the hypothesis ids and score, and the BLEU line it prints;
- `hub.json`: the hub interface's translations of raw test sentences (Moses + BPE in, BPE
  removal + Moses detokenization out), beam 5.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch

SRC, TGT = "en", "de"
TRAIN, VALID, TEST = 2500, 200, 40
MERGES = 700

MODELS = {
    "iwslt": ["--arch", "fconv_iwslt_de_en", "--encoder-embed-dim", "48",
              "--encoder-layers", "[(48, 3)] * 2", "--decoder-embed-dim", "48",
              "--decoder-layers", "[(48, 3)] * 2", "--decoder-out-embed-dim", "32"],
    "mixed": ["--arch", "fconv", "--encoder-embed-dim", "40",
              "--encoder-layers", "[(40, 3)] * 2 + [(56, 1)] + [(32, 5)]",
              "--decoder-embed-dim", "40",
              "--decoder-layers", "[(40, 3)] + [(56, 1)] + [(32, 3)]",
              "--decoder-attention", "[True, False, True]",
              "--decoder-out-embed-dim", "40", "--share-input-output-embed"],
}


def read(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def run(*cmd: str, cwd: Path | None = None) -> str:
    """One of the reference's commands (fairseq-train, ...) from this interpreter's venv."""
    tool = Path(sys.executable).parent / cmd[0]
    cmd = (str(tool) if tool.exists() else cmd[0], *cmd[1:])
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def main() -> None:
    # The reference's loader calls torch.load without weights_only, which torch >= 2.6 refuses
    # for its pickled arguments: switched off here, in the reference's scratch environment only
    # (this project's importer reads the same files with an allowlist instead).
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", required=True, help="../shared/data/multi30k")
    args = p.parse_args()
    from fairseq_quality import moses_bpe  # (this folder's: the same text pipeline)

    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fairseq-fixtures-"))
    raw = {(split, lang): read(data / f"{stem}.{lang}.gz", n)
           for split, stem, n in (("train", "train", TRAIN), ("valid", "val", VALID),
                                  ("test", "test_2016_flickr", TEST))
           for lang in (SRC, TGT)}
    moses_bpe(raw, work, MERGES)
    codes = work / "bpecodes"
    run("fairseq-preprocess", "--source-lang", SRC, "--target-lang", TGT,
        "--trainpref", str(work / "train.bpe"), "--validpref", str(work / "valid.bpe"),
        "--testpref", str(work / "test.bpe"), "--destdir", str(work / "bin"),
        "--workers", "1")
    versions = {"fairseq-fixed": version("fairseq-fixed"), "torch": torch.__version__,
                "subword-nmt": version("subword-nmt"), "sacremoses": version("sacremoses"),
                "python": sys.version.split()[0], "data": f"multi30k train[:{TRAIN}] "
                f"val[:{VALID}] test_2016_flickr[:{TEST}], {MERGES} joint BPE merges"}
    for name, arch in MODELS.items():
        save = work / f"ckpt_{name}"
        run("fairseq-train", str(work / "bin"), *arch, "--source-lang", SRC,
            "--target-lang", TGT, "--dropout", "0.1", "--optimizer", "nag", "--lr", "0.25",
            "--clip-norm", "0.1", "--max-tokens", "1500", "--max-update", "400",
            "--max-source-positions", "128", "--max-target-positions", "128",
            "--save-dir", str(save), "--no-epoch-checkpoints", "--no-save-optimizer-state",
            "--seed", "1", "--cpu", "--num-workers", "0", "--log-format", "simple")
        dest = out / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        shutil.copy(save / "checkpoint_last.pt", dest / "model.pt")
        for lang in (SRC, TGT):
            shutil.copy(work / "bin" / f"dict.{lang}.txt", dest / f"dict.{lang}.txt")
        shutil.copy(codes, dest / "bpecodes")
        record(dest, work, raw)
        (dest / "README.md").write_text(
            f"Made by scripts/fairseq_fixtures.py with fairseq-train {' '.join(arch)} "
            "(400 updates, NAG lr 0.25, clip 0.1, dropout 0.1, max positions 128).\n")
    (out / "VERSIONS.json").write_text(json.dumps(versions, indent=1) + "\n")
    shutil.rmtree(work)


def record(dest: Path, work: Path, raw: dict) -> None:
    """The reference's own outputs on the model in `dest`."""
    from fairseq.models.fconv import FConvModel

    hub = FConvModel.from_pretrained(str(dest), checkpoint_file="model.pt",
                                     data_name_or_path=".", tokenizer="moses",
                                     bpe="subword_nmt", bpe_codes=str(dest / "bpecodes"),
                                     source_lang=SRC, target_lang=TGT)
    hub.eval()
    model = hub.models[0]
    src_sents, ref_sents = raw[("test", SRC)][:6], raw[("test", TGT)][:6]
    items = []
    with torch.no_grad():
        for s, t in zip(src_sents, ref_sents):
            src = hub.encode(s)
            tgt = hub.tgt_dict.encode_line(hub.apply_bpe(hub.tokenize(t)),
                                           add_if_not_exist=False).long()
            prev = torch.cat([tgt.new_tensor([hub.tgt_dict.eos()]), tgt[:-1]])
            logits, _ = model(src[None], torch.tensor([len(src)]), prev[None])
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)[0]
            items.append({"src": src, "prev": prev, "target": tgt, "lprobs": lprobs.float()})
    torch.save(items, dest / "logprobs.pt")
    text = run("fairseq-generate", str(work / "bin"), "--path", str(dest / "model.pt"),
               "--source-lang", SRC, "--target-lang", TGT, "--gen-subset", "test",
               "--beam", "5", "--batch-size", "16", "--cpu")
    src_ids, hyps = {}, {}
    for line in text.splitlines():
        if m := re.match(r"S-(\d+)\t(.*)", line):
            src_ids[int(m[1])] = m[2]
        elif m := re.match(r"H-(\d+)\t(\S+)\t(.*)", line):
            hyps[int(m[1])] = {"score": float(m[2]), "text": m[3]}
    bleu = next((line for line in text.splitlines() if "BLEU" in line), "")
    gen = [{"id": i, "source_bpe": src_ids[i], "hypothesis_bpe": hyps[i]["text"],
            "score": hyps[i]["score"]} for i in sorted(hyps)]
    (dest / "generate.json").write_text(json.dumps({"beam": 5, "bleu_line": bleu,
                                                    "sentences": gen}, indent=1) + "\n")
    translations = hub.translate(raw[("test", SRC)], beam=5)
    (dest / "hub.json").write_text(json.dumps({"beam": 5, "source": raw[("test", SRC)],
                                               "reference": raw[("test", TGT)],
                                               "translation": translations},
                                              indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
