"""Print pairs of the synthetic demo corpus.

    python -m preprocessing.demo [--task translation|summarization] [--seed 1] [--start 0] \\
        [--count 10]
"""

from __future__ import annotations

import argparse

from preprocessing.demo import VOCABULARY_SIZE, corpus, summarization_pairs, translation_pairs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m preprocessing.demo",
                                     description="Print pairs of the synthetic demo corpus.")
    parser.add_argument("--task", choices=["translation", "summarization"], default="translation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    make = translation_pairs if args.task == "translation" else summarization_pairs
    for source, target in make(args.seed, args.start, args.count):
        print(f"{source}\n  -> {target}")
    print(f"# {corpus(args.task).size:,} distinct pairs per seed; word types: {VOCABULARY_SIZE}")


if __name__ == "__main__":
    main()
