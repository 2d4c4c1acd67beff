"""python -m preprocessing --task TASK ...: see preprocessing/cli.py."""

import sys

try:
    from storage.signals import command_signals, sigterm_as_ctrl_c  # (the standard library)

    # A Ctrl-C inside an import waits for it, none is dropped; SIGTERM is a Ctrl-C from here.
    with command_signals(), sigterm_as_ctrl_c():
        from preprocessing.cli import main

        sys.exit(main())
except KeyboardInterrupt:  # before the stages began (the imports, the settings)
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)
