"""The workflows' error for a bad setting or input, importable by every config module."""


class SpecError(ValueError):
    """A run-level option that cannot apply to the preset; the message names the flag and
    the fix (the command line prints it as one `error:` line, exit 2)."""
