"""python -m preprocessing --task TASK ...: see preprocessing/cli.py."""

import sys

try:
    from storage.signals import command_signals  # (the standard library only)

    with command_signals():  # a Ctrl-C inside an import waits for it; none is dropped
        from preprocessing.cli import main

        sys.exit(main())
except KeyboardInterrupt:  # before the stages began (the imports, the settings)
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)
