"""python -m convs2s {translate,serve,train,average,score,attention,import-fairseq,
export-fairseq} ...: see convs2s/cli.py."""

import sys

from convs2s.cli import main

sys.exit(main())
