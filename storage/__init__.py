"""One filesystem layer for every path the project reads or writes (docs/storage.md).

A local path stays a `pathlib.Path` and behaves exactly as before; a URI (`s3://`, `gs://`,
any scheme pyarrow serves) becomes an `ObjectPath` with the same small set of methods, served
by `pyarrow.fs`, the library Ray Data and Ray Train use. Credentials and endpoints come from
the standard environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, profiles, instance roles),
read by pyarrow itself; nothing here takes or prints a credential.

    from storage import location, local_copy, publish_dir, check_storage
    run = location("s3://bucket/runs") / "demo"     # ObjectPath; location("runs") -> Path
    (run / "workflow.json").write_text("{}")
    torch.load(local_copy(run / "best" / "checkpoint.pt"))   # fetched once per node
    publish_dir(tmp_dir, run / "best", marker="meta.json")   # the marker object last
    check_storage("s3://bucket/runs", "--storage-path")       # StorageError: one line

The filesystem layer is `storage.paths` (locations, `ObjectPath`) and `storage.transfer`
(copies, published folders), with `storage.checks`, `storage.lease` (one writer per run) and
`storage.scratch`. What else both packages' commands share: `storage.settings`, settings values
typed and checked the same way from `--set`, a settings file or a saved config;
`storage.signals`, how a command and its Ray stages stop on Ctrl-C or SIGTERM;
`storage.ray_join`, starting or joining Ray (RAY_ADDRESS); `storage.redact`, credentials hidden
in a URI or a message.

Imports flow `workflows -> {preprocessing, convs2s} -> storage`: this package imports neither.
"""

import importlib

# What the package offers, by the module that holds it: imported when first asked for, so that
# `storage.signals` (a command's first import, before its Ctrl-C handling is in place) and
# `storage.settings` load no pyarrow.
_FROM = {**dict.fromkeys(["ObjectPath", "StorageError", "binary_kind", "cr_line_ends",
                          "filesystem_of", "is_uri", "location", "open_input", "shown",
                          "stamp", "synced", "wide_encoding", "worker_path", "write_whole"],
                        "storage.paths"),
         **dict.fromkeys(["local_copy", "move_tree", "publish_dir", "remove_tree",
                          "side_by_side", "written_locally"], "storage.transfer"),
         "check_storage": "storage.checks"}

__all__ = sorted(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(_FROM[name]), name)
    globals()[name] = value  # (asked once)
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM])
