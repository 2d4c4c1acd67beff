"""Search settings chosen on a validation set: BLEU of a trained model at each length penalty
(and beam), so that a recipe's `SearchConfig` is picked on validation data and the test set
only gives the final number.

    python -m benchmarks.lenpen --checkpoint RUN/weights/best \\
        --valid ../shared/data/multi30k val en de --lenpen 0.6 0.8 1.0 1.2 1.5 2.0 --beam 5

Writes benchmarks/results/lenpen_<set>.json (or --out) and prints BLEU, chrF and the length
ratio per setting, the best first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.corpus import read_pairs
from benchmarks.machine import load_average, machine_info
from benchmarks.report import RESULTS_DIR, format_table, write_result
from convs2s.config import INFERENCE_PRECISIONS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lenpen",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, nargs="+", required=True,
                   help="checkpoint directories (several: an ensemble)")
    p.add_argument("--valid", nargs=4, metavar=("DIR", "NAME", "SRC", "TGT"), required=True,
                   help="the validation set: folder, file stem, source and target language")
    p.add_argument("--lenpen", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2, 1.5, 2.0])
    p.add_argument("--beam", type=int, nargs="+", default=[5])
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--precision", choices=INFERENCE_PRECISIONS, default="fp32")
    p.add_argument("--out", type=Path)
    p.add_argument("--replace", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import sacrebleu
    import torch

    from convs2s.config import SearchConfig
    from convs2s.inference.translate import load_for_inference

    args = parse_args(argv)
    folder, name, src_lang, tgt_lang = args.valid
    pairs = read_pairs(Path(folder), [name], src_lang, tgt_lang)
    src, refs = [s for s, _ in pairs], [t for _, t in pairs]
    load_before = load_average()
    base = SearchConfig(max_len_a=args.max_len_a, max_len_b=args.max_len_b,
                        precision=args.precision)
    translator = load_for_inference(args.checkpoint, base)
    rows = []
    for beam in args.beam:
        for lenpen in args.lenpen:
            translator.search = translator.search.replace(beam=beam, lenpen=lenpen)
            hyps = translator.translate(src)
            bleu = sacrebleu.corpus_bleu(hyps, [refs])
            chrf = sacrebleu.corpus_chrf(hyps, [refs])
            rows.append({"beam": beam, "lenpen": lenpen, "bleu": round(bleu.score, 2),
                         "chrf": round(chrf.score, 2),
                         "length_ratio": round(bleu.sys_len / bleu.ref_len, 3)})
            print(f"beam {beam} lenpen {lenpen:g}: BLEU {bleu.score:.2f}", file=sys.stderr)
    rows.sort(key=lambda r: -r["bleu"])
    print(format_table(rows, [("beam", "beam"), ("lenpen", "lenpen"), ("bleu", "BLEU"),
                              ("chrf", "chrF"), ("length_ratio", "length ratio")]))
    out = args.out or RESULTS_DIR / f"lenpen_{name}.json"
    settings = {k: ([str(p) for p in v] if k == "checkpoint" else v) for k, v in
                vars(args).items() if k not in ("out", "replace")}
    path = write_result(out, "lenpen", settings, machine_info(torch.device("cpu")),
                        load_before, load_average(), {"quiet": None},
                        {"rows": rows, "best": rows[0]},
                        notes=["sacreBLEU 13a on detokenized output; choose on a validation "
                               "set, never on the test set"], replace=args.replace)
    print(f"best: beam {rows[0]['beam']} lenpen {rows[0]['lenpen']:g} "
          f"(BLEU {rows[0]['bleu']}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
