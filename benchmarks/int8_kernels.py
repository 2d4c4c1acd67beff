"""int8 on CPUs with and without int8 dot products: how many beam-search outputs of a trained
model stay those of its float32 weights, and its BLEU, on each kernel path.

x86 CPUs without VNNI / AMX (AVX2-only hosts) sum u8 x s8 pairs in 16 bits, which saturates
for 8-bit weights times 8-bit activations. Two ways round it are compared on those kernels
(fbgemm's AVX2 path, forced on any x86 host with FBGEMM_ENABLE_INSTRUCTIONS=AVX2, the CPU-flag
probe told "no VNNI"):
- `weights7`: 7-bit weights, 8-bit activations (`convs2s.inference.quantize.weight_levels`, what the
  project does);
- `activations7`: 8-bit weights, 7-bit activations (PyTorch's own `reduce_range` rule, what
  the project did before);
and the host's own path (`native`: oneDNN where the CPU has VNNI).

    python -m benchmarks.int8_kernels --checkpoint RUN/best --src test.en --ref test.fr

Each variant runs in its own process (the ISA is read when fbgemm loads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.machine import REPO, load_average, machine_info
from benchmarks.report import RESULTS_DIR, write_result

_CHILD = """
import json, sys, time
import convs2s.inference.quantize as q
variant, ckpt, src, ref, n = sys.argv[1:6]
if variant != "native":
    q.has_int8_dot_products = lambda: False
if variant == "activations7":  # PyTorch's rule: 8-bit weights, activations in 7 bits
    q.weight_levels = lambda: 127
    def forward(self, x):
        shape = x.shape
        import torch
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float().contiguous(),
                                               self._packed, True)
        return y.view(*shape[:-1], self.out_features)
    q.Int8Linear.forward = forward
from convs2s.config import SearchConfig
from convs2s.metrics.scoring import read_lines, score_translation
from convs2s.inference.translate import load_for_inference
lines, refs = read_lines(src)[:int(n)], read_lines(ref)[:int(n)]
fp32 = load_for_inference([ckpt], SearchConfig(beam=5)).translate(lines)
tr = load_for_inference([ckpt], SearchConfig(beam=5, precision="int8"))
t0 = time.perf_counter()
out = tr.translate(lines)
seconds = time.perf_counter() - t0
print(json.dumps({"engine": tr.models[0].encoder.fc1.engine,
                  "levels": tr.models[0].encoder.fc1.levels,
                  "same_as_fp32": sum(a == b for a, b in zip(fp32, out)), "sentences": len(lines),
                  "bleu_int8": score_translation(out, refs, ref.rsplit(".", 1)[-1])["bleu"],
                  "bleu_fp32": score_translation(fp32, refs, ref.rsplit(".", 1)[-1])["bleu"],
                  "int8_seconds": round(seconds, 3)}))
"""


def run_variant(variant: str, args) -> dict:
    env = dict(os.environ)
    if variant != "native":
        env["FBGEMM_ENABLE_INSTRUCTIONS"] = "AVX2"
    proc = subprocess.run([sys.executable, "-c", _CHILD, variant, args.checkpoint, args.src,
                           args.ref, str(args.sentences)], capture_output=True, text=True,
                          env=env, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (a run's best/)")
    p.add_argument("--src", required=True, help="source sentences, one a line")
    p.add_argument("--ref", required=True, help="their references")
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--out", default=str(RESULTS_DIR / "int8_kernels.json"))
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)
    before = load_average()
    results = {v: run_variant(v, args) for v in ("native", "weights7", "activations7")}
    for name, r in results.items():
        print(f"{name:13s} engine {r['engine']:7s} weights +-{r['levels']}: "
              f"{r['same_as_fp32']}/{r['sentences']} outputs as float32, BLEU "
              f"{r['bleu_int8']:.2f} (float32 {r['bleu_fp32']:.2f}), {r['int8_seconds']:.1f} s")
    path = write_result(args.out, "int8_kernels", vars(args), machine_info(), before,
                        load_average(), {}, results, replace=args.replace)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
