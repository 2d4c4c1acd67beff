"""The command lines of the model package, apart from its library modules:

    convs2s-translate --checkpoint runs/demo/best [runs/other/best ...] < src.txt > hyp.txt
    python -m convs2s translate --checkpoint ... --input src.txt --output hyp.txt [--beam 5 ...]
    python -m convs2s translate --checkpoint ... --input mono.en.gz --output parts/ --actors 4
    python -m convs2s serve --checkpoint runs/demo/best  (or --model models:/NAME@champion)
    python -m convs2s train --train-data CUT/train --valid-data CUT/valid \\
        --spm-model PREP/spm/spm.model --storage-path runs --run-name demo  (no Ray: train/local.py;
        CUT: a preprocessing output's batches for one token budget, PREP/batches/<hash>)
    python -m convs2s average --out runs/demo/avg runs/demo/checkpoint_*
    python -m convs2s score --hyp hyp.fr --ref newstest2014.fr --lang fr [--json]
    python -m convs2s attention --checkpoint runs/demo/best --out pics "the cat is small ."
    python -m convs2s import-fairseq wmt14.v2.en-fr.fconv-py --out runs/paper/en-fr
    python -m convs2s export-fairseq runs/demo/best --out exported/

Bad input (a missing or unreadable file, a checkpoint that is not ours) is one line on stderr
naming the file, exit status 2; nothing half-written is left behind.

The commands live in modules of their own (translate_command, serve_command, tools); each
imports what it needs when it runs: `convs2s-translate` does not pay for matplotlib
(attention), sacreBLEU / rouge (score) or Ray (serve) at start-up.
"""

from __future__ import annotations

import sys

from convs2s.cli.serve_command import serve
from convs2s.cli.tools import attention, average, export_fairseq, import_fairseq, score, train
from convs2s.cli.translate_command import translate

__all__ = ["COMMANDS", "main", "translate_script", "translate", "serve", "train", "average",
           "score", "attention", "import_fairseq", "export_fairseq"]

COMMANDS = {"translate": translate, "serve": serve, "train": train, "average": average,
            "score": score,
            "attention": attention, "import-fairseq": import_fairseq,
            "export-fairseq": export_fairseq}


def main(argv: list[str] | None = None, command_line: bool | None = None) -> int:
    """python -m convs2s <command> ...: one of COMMANDS. As a command (no argv, or
    `command_line`), the Ray commands' console keeps Ray's harmless lines in its log files
    (convs2s.console)."""
    command_line = argv is None if command_line is None else command_line
    argv = sys.argv[1:] if argv is None else argv
    usage = (f"usage: python -m convs2s {{{','.join(COMMANDS)}}} ...  (--help after a command "
             "for its flags)")
    if argv[:1] in (["--help"], ["-h"]):  # asked for: on stdout, exit 0
        print(usage)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        return 2
    if command_line and (argv[0] == "serve" or "--actors" in argv):
        from convs2s.console import harmless_ray_lines_dropped

        with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1):
            return COMMANDS[argv[0]](argv[1:])
    return COMMANDS[argv[0]](argv[1:])


def translate_script() -> int:
    """The `convs2s-translate` console script: `python -m convs2s translate` as a command, with
    its signal handling (a Ctrl-C while the model loads is "interrupted", 130, not a traceback)
    and, with --actors, Ray's harmless lines kept in its log files."""
    from storage.signals import command_signals  # (the standard library only)

    try:
        with command_signals():
            return main(["translate", *sys.argv[1:]], command_line=True)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
