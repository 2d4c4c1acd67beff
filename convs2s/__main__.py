"""python -m convs2s {translate,serve,train,average,score,attention,import-fairseq,
export-fairseq} ...: see convs2s/cli/."""

import sys

try:
    from storage.signals import command_signals  # (the standard library only)

    with command_signals():  # a Ctrl-C inside torch's import: no abort; none dropped
        from convs2s.cli import main

        sys.exit(main())
except KeyboardInterrupt:  # (a Ctrl-C before a command took it, e.g. while torch imports)
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)
