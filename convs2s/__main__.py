"""python -m convs2s {translate,average,score,attention} ...: see convs2s/cli.py."""

import sys

from convs2s.cli import main

sys.exit(main())
