"""Credentials never printed, logged or stored: a URI's `user:password@` (or `token@`) and a
secret query parameter (`?X-Amz-Signature=`, `?token=`) shown as `***`, in a URI and in any text
quoting one (a library's error message). Shared by both packages' commands (RAY_ADDRESS is shown
through it by `storage.ray_join`); what MLflow's own loggers write: `convs2s.tracking.redact`.

    redact_uri("http://alice:pw@mlflow:5000")      # 'http://alice:***@mlflow:5000'
    redact_text(str(err))                          # every URI in a message
    redact_logs("huggingface_hub")                 # what a library's own loggers write

Paths in storage/ messages: `storage.paths.shown`.
"""

from __future__ import annotations

import logging
import re

# A URI in a message: scheme:// and what follows up to whitespace (a quote is allowed in it,
# RFC 3986 allows one unencoded in a password)
_URI = re.compile(r"([A-Za-z][\w+.-]*://)(\S+)")
_HOST_PORT = re.compile(r"(?:[\w.-]*|\[[0-9A-Fa-f:.]*\])(?::\d*)?")
# a query parameter that carries a secret (a presigned URL's signature, a token)
_SECRET_PARAM = re.compile(r"(?i)([?&](?:x-(?:amz|goog)-(?:credential|signature|security-token)|"
                           r"signature|sig|awsaccesskeyid|password|passwd|pwd|auth|jwt|"
                           r"credentials?|(?:[\w.-]*[_.-])?"
                           r"(?:access|api|auth|refresh|session|id)?(?:token|secret|key))"
                           r"=)[^&\s'\"#]+")


# Schemes whose URIs name a local path after an empty authority ("file:///", "sqlite:////")
PATH_SCHEMES = ("file://", "sqlite://")


def _hide(m: re.Match) -> str:
    """One URI with its user information hidden. The authority is what comes before the first
    "/", "?" or "#"; a password may hold "@" (the last "@" of the authority ends it) and, written
    unencoded, "/", "?" or "#" too: where the authority is then no host[:port] ("alice:pa" of
    "alice:pa/ss@host"), or a host:port with an "@" after it, everything up to the URI's last
    "@" is hidden (a message may lose a path's "@", never a password)."""
    scheme, rest = m[1], m[2]
    if "@" not in rest:
        return m[0]
    # slashes after "scheme://" (http:///alice:pw@host, postgresql:///db:pw@host): the
    # authority begins after them (it was empty, and the password shown); a scheme whose
    # authority is empty by design names a path there (file:///a@b/c, sqlite:////x@v2/db)
    if scheme.lower() not in PATH_SCHEMES:
        lead = rest[:len(rest) - len(rest.lstrip("/"))]
        scheme, rest = scheme + lead, rest[len(lead):]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    at = authority.rfind("@")
    # an "@" after the authority, after a "host" without a port, ends a password that held
    # "/", "?" or "#": one in its path ("alice:p@ss/word@host"), or past a "?" or "#" where the
    # "host" is no domain name either ("alice:p@ss/w?rd@host"; an e-mail in the query of
    # "alice:pw@mlflow.example.com/x?to=a@b.com" is no password's)
    host = authority[at + 1:]
    path = re.split(r"[?#]", rest[len(authority):], maxsplit=1)[0]
    unsure = ":" not in host and ("@" in path or "@" in rest[len(authority):]
                                  and "." not in host and host != "localhost")
    if at >= 0 and _HOST_PORT.fullmatch(authority[at + 1:]) and not unsure:
        userinfo, tail = authority[:at], rest[at:]
    elif at < 0 and ":" not in authority:  # a plain host: an "@" in the path (s3://b/k@x)
        return m[0]
    else:
        at = rest.rfind("@")
        userinfo, tail = rest[:at], rest[at:]
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon and not re.search(r"[/?#@]", user) else "***"
    return f"{scheme}{shown}{tail}"


def redact_uri(uri: str | None) -> str | None:
    """`uri` as it may be printed, logged or stored: the password of `user:password@host` (or
    a bare token `token@host`) replaced by `***`, and so is a secret query parameter's value
    (`?X-Amz-Signature=`, `?token=`). Credentials are never shown (they reach MLflow through
    the URI itself, or $MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN). A string that is no
    URI but begins as an authority does (`user:password@host:port`, or a scheme that lost a
    slash, `http:/user:password@host`) has its user information hidden too; a path is not
    touched."""
    if not uri:
        return uri
    if "://" not in uri:
        uri = _BARE_USERINFO.sub(r"\1***@", uri, count=1)
    return redact_text(uri)


# `[scheme:/]userinfo@` at the start of a string without "://" (a path begins with "/" or has
# one before any "@": no match)
_BARE_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:/)?)[^/@\s]+@")


def redact_text(text: str) -> str:
    """`text` (a library's error message, which may quote the URI it used) with every URI's
    credentials replaced by `***`, as `redact_uri`."""
    return _SECRET_PARAM.sub(r"\1***", _URI.sub(_hide, text))


class RedactCredentials(logging.Filter):
    """A log record's text and traceback with every URI's credentials redacted (`redact_text`);
    a record with none is left exactly as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format is the handler's to report, as always
            return True
        if "://" in text and (hidden := redact_text(text)) != text:
            record.msg, record.args = hidden, ()
        if record.exc_info and not record.exc_text:  # (the text formatters cache and print)
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and "://" in record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


_REDACT = RedactCredentials()
_REDACTED_AT: dict[str, tuple] = {}  # library -> the counts of loggers and handlers then


def redact_logs(library: str) -> None:
    """Redact credentials in what a library's own loggers write (MLflow's messages quote the
    tracking URI, huggingface_hub's retry warnings the URL of a mirror, password included). A
    filter on a logger does not reach its children's records, so it goes on every logger of
    `library` made so far and on the handlers of `library` and the root (where the records of
    loggers made later end up); idempotent, and cheap when no logger or handler was made
    since the last call."""
    now = (len(logging.Logger.manager.loggerDict), len(logging.getLogger(library).handlers),
           len(logging.getLogger().handlers))
    if _REDACTED_AT.get(library) == now:
        return
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == library or name.startswith(f"{library}.")]
    for target in [*loggers, *logging.getLogger(library).handlers,
                   *logging.getLogger().handlers]:
        if _REDACT not in target.filters:
            target.addFilter(_REDACT)
    _REDACTED_AT[library] = now
