"""python -m convs2s {translate,serve,train,average,score,attention,import-fairseq,
export-fairseq} ...: see convs2s/cli/."""

import sys

try:
    from convs2s.cli import main

    sys.exit(main())
except KeyboardInterrupt:  # (a Ctrl-C before a command took it, e.g. while torch imports)
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)
