"""The reference implementation's generation speed on given batches: run with the reference's
own interpreter (the scratch environment of scripts/fairseq_fixtures.sh), never the project's.

`python -m benchmarks.generation --reference-python /tmp/fairseq-ref-venv/bin/python ...` calls
it once per timed round and beam, on an archive `convs2s.io.fairseq.export_fairseq` wrote
from the same checkpoint (the dictionaries list the sentencepiece pieces in id order, so token
ids are the same on both sides) and on the same batches (source ids, EOS-terminated; left
padded here, as the reference's translation task pads sources):

    python scripts/fairseq_generation_speed.py --archive DIR --batches batches.json \
        --beam 5 --threads 2 --max-len-a 1.2 --max-len-b 10 --out result.json

The result holds the seconds of the timed pass (model loading and a warm-up batch excluded)
and each sentence's best hypothesis (token ids, EOS included), batch by batch.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    # The reference's loader calls torch.load without weights_only, which torch >= 2.6 refuses
    # for its pickled arguments: switched off in the reference's scratch environment only.
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    p = argparse.ArgumentParser()
    p.add_argument("--archive", required=True)
    p.add_argument("--batches", required=True, help="JSON: list of batches of id lists")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    torch.set_num_threads(args.threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(args.archive, "model.pt")], arg_overrides={"data": args.archive})
    for m in models:
        m.eval()
        m.make_generation_fast_(beamable_mm_beam_size=args.beam)  # what fairseq-generate does
    gen = SequenceGenerator(models, task.target_dictionary, beam_size=args.beam,
                            max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=1,
                            normalize_scores=True, len_penalty=1.0, unk_penalty=0.0)
    pad = task.source_dictionary.pad()
    batches = json.loads(open(args.batches).read())

    def sample(batch: list[list[int]]) -> dict:
        S = max(len(s) for s in batch)
        tokens = torch.full((len(batch), S), pad, dtype=torch.long)
        for i, s in enumerate(batch):
            tokens[i, S - len(s):] = torch.tensor(s)  # left padded
        return {"net_input": {"src_tokens": tokens,
                              "src_lengths": torch.tensor([len(s) for s in batch])},
                "id": torch.arange(len(batch))}

    samples = [sample(b) for b in batches]
    with torch.inference_mode():
        warm = {"net_input": {k: v[:8] for k, v in samples[0]["net_input"].items()},
                "id": samples[0]["id"][:8]}
        gen.generate(models, warm)
        t0 = time.perf_counter()
        outs = [gen.generate(models, s) for s in samples]
        seconds = time.perf_counter() - t0
    hyps = [[h[0]["tokens"].tolist() for h in out] for out in outs]
    with open(args.out, "w") as f:
        json.dump({"seconds": seconds, "hypotheses": hyps, "beam": args.beam,
                   "torch": torch.__version__, "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main()
