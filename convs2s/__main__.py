"""python -m convs2s {translate,serve,train,average,score,attention,import-fairseq,
export-fairseq} ...: see convs2s/cli/."""

import signal
import sys

from convs2s.console import (  # (no dependencies: imports nothing heavy)
    ctrl_c_after_imports, ctrl_c_never_lost)

signal.signal(signal.SIGINT, ctrl_c_after_imports)  # a Ctrl-C inside torch's import: no abort
try:
    with ctrl_c_never_lost():  # nor dropped inside a finalizer
        from convs2s.cli import main

        sys.exit(main())
except KeyboardInterrupt:  # (a Ctrl-C before a command took it, e.g. while torch imports)
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)
