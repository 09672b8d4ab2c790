"""One redaction for every line kfit prints or records, and one way to show a user's value in a message.

`redact(text)`: credentials hidden as ***, wherever they appear in a line: a URL's user:password@ (greedy to
the last @ of the word: a password may hold an unescaped @), and the values of secret query parameters and
key=value pairs (password, passwd, pwd, secret, token, api_key, apikey, access_key, auth, credential...).
The CLI routes its own stdout and stderr through it (`RedactingStream`), so a tracker library's or a
database driver's message printed from this process is redacted too, and so are the run's recorded events
(lib/monitor.py). A database URL's password is also hidden where it appears without its URL
(lib/hpo/storage.py's redact, which adds that to this one).

`shown(value)`: a user's value quoted for a message: control and format characters escaped (`escaped`: newlines,
a NUL, a terminal's escapes, a BOM, zero-width and right-to-left characters, so a value can never forge a line of
kfit's output nor hide a character), cut to a readable length.

Layer 1 (docs/architecture.md): it imports nothing from lib.
"""

from __future__ import annotations

import io
import re
import unicodedata

# A secret's name ends with one of these words (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY, sslpassword): a name
# that only holds one (tokens_per_s, "tokens/s") is not a secret's.
SECRET_WORDS = (r"pass(?:word|wd)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|auth|credentials?|"
                r"private[_-]?key|session[_-]?key")
_SECRET_NAME = rf"[\w.-]*(?:{SECRET_WORDS})\b"
USER_PASSWORD = re.compile(r"([A-Za-z][\w+.-]{0,39}://[^:/@\n]*):(?:(?!://)[^@\n])*@(?:[^\s@]*@)*")
# a query parameter named as a secret, or a bare key / sig / signature (a signed URL's, an sqlite URL's ?key=)
QUERY_SECRET = re.compile(rf"(?i)([?&;](?:{_SECRET_NAME}|(?:[\w.-]*[-_])?(?:key|sig|signature))=)[^&#\s]*")
# NAME=value and "name": "value" outside URLs (an environment dump, a JSON error body, a netrc-like line)
PAIR_SECRET = re.compile(rf"(?i)((?<![\w.-]){_SECRET_NAME}[\"']?\s*[=:]\s*[\"']?)(?!\*\*\*)[^\s\"'&,;]+")
NETRC_SECRET = re.compile(r"(?i)(\bpassword\s+)\S+")
# user:password@host without a scheme (HPO_STORAGE='user:pw@host:5432/db', a DSN): the word before the colon a
# name, the host after the @ a name or an address
BARE_USER_PASSWORD = re.compile(r"(?<![\w/:@.+%-])([A-Za-z_][\w.+%-]{0,63}):[^\s/@]+@(?=[\w\[])")
# an HTTP header's credentials (Authorization: Bearer ..., Basic ...), and a bare bearer token
HEADER_SECRET = re.compile(r"(?i)(\b(?:proxy-)?authorization\s*[:=]\s*(?:bearer|basic|token|digest)?\s*|\bbearer\s+)"
                           r"(?!\*\*\*)[^\s\"',;]+")
LIMIT = 200  # characters of a user's value shown in a message
_SECRET_WORD = re.compile(rf"(?i)[\w.-]*(?:{SECRET_WORDS})")


def secret_name(name: str) -> bool:
    """Whether `name` is a secret's (MLFLOW_TRACKING_TOKEN, CONFIG_NOSUCH_PASSWORD, sslpassword), whose value no
    message shows."""
    return _SECRET_WORD.fullmatch(name) is not None


def redact(text: str) -> str:
    """`text` with every credential shown as ***."""
    if not text:
        return text
    text = USER_PASSWORD.sub(r"\1:***@", text)
    text = BARE_USER_PASSWORD.sub(r"\1:***@", text)
    text = HEADER_SECRET.sub(r"\1***", text)
    text = QUERY_SECRET.sub(r"\1***", text)
    text = PAIR_SECRET.sub(r"\1***", text)
    return NETRC_SECRET.sub(r"\1***", text)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
# what is never shown as itself: control characters (C0, DEL, C1: a terminal's escapes, line breaks), format
# characters (zero-width spaces and joiners, a BOM, right-to-left overrides: invisible, or reordering what
# follows), lone surrogates (a file name's undecodable bytes) and the Unicode line and paragraph separators
_HIDDEN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def _escaped_char(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    if c.isprintable() or c == " " or unicodedata.category(c) not in _HIDDEN:
        return c
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escaped(value: object) -> str:
    """`value` as text that is one line with every character visible: control and format characters, lone
    surrogates and line separators as \\n, \\x1b, \\u200b, \\u202e... (the rest as it is, whole)."""
    text = str(value)
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(map(_escaped_char, text))


def visible_text(text: str) -> str:
    """Text kfit prints as text of several lines (a generated sample): its line breaks and tabs kept, every
    other control or format character escaped as `escaped` shows it, so a model's output (or a prompt) can
    never send a terminal an escape sequence or hide what it says."""
    if text.isprintable():
        return text
    return "\n".join("\t".join(escaped(piece) for piece in line.split("\t")) for line in text.split("\n"))


def shown(value: object, limit: int = LIMIT) -> str:
    """A user's value for a message: escaped (`escaped`: never an extra line, a terminal's escape or an invisible
    character), redacted, and cut to `limit` characters with how much more there was."""
    raw = str(value)
    # redacted before it is cut (a cut can leave a secret without the @ that marks it), over a head far longer
    # than any secret, so that a value of megabytes costs no more than one of 64 KiB
    head = raw[:max(4 * limit, 1 << 16)]
    text = redact(escaped(head))
    if len(text) <= limit and len(head) == len(raw):
        return text
    return text[:limit] + f"... ({len(text) - limit + len(raw) - len(head):,} more characters)"


# What a piece of printed text may hold besides visible characters: line breaks and tabs, carriage returns
# that start or end the piece (a progress line redrawn, tqdm's or the monitor's) and the one terminal sequence
# kfit's own status lines use (erase to the end of the line). Any other control or format character, a
# value's (a path holding ESC or a carriage return, a link's target), is shown escaped: it cannot recolour,
# clear or overwrite what the terminal shows.
_KEPT = ("\n", "\t")
_ERASE = "\x1b[K"


def guarded(text: str) -> str:
    """`text` as kfit prints it (RedactingStream): control and format characters escaped as `escaped` shows
    them, except line breaks, tabs, the carriage returns at either end and the erase-to-end-of-line sequence."""
    if text.isprintable():  # the common case, at C speed
        return text
    body = text.strip("\r")
    head = text[:len(text) - len(text.lstrip("\r"))]
    tail = text[len(head) + len(body):] if body else ""
    parts = []
    for i, piece in enumerate(body.split(_ERASE)):
        if i:
            parts.append(_ERASE)
        parts.append("".join(c if c in _KEPT else _escaped_char(c) for c in piece))
    return head + "".join(parts) + tail


class RedactingStream(io.TextIOBase):
    """A text stream that redacts each line before it reaches `stream` (kfit's stdout and stderr). Text is held
    until its line ends, so a secret split across two writes is still whole when redacted; a progress bar's
    carriage returns end a piece as a newline does."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream, self._pending = stream, ""

    def write(self, text: str) -> int:
        self._pending += guarded(text)
        cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
        if cut >= 0:
            ready, self._pending = self._pending[:cut + 1], self._pending[cut + 1:]
            self.stream.write(redact(ready))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(redact(self._pending))
            self._pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    @property
    def errors(self):
        return getattr(self.stream, "errors", "strict")

    def writable(self) -> bool:
        return True
