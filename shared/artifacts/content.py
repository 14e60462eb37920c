"""The content rules of artifacts, as reference 004's implementation (mnemory) has them:
`content` is UTF-8 text when content_type is text/*, else base64; a read returns text in
pages of characters and binary whole, base64-encoded."""

from __future__ import annotations

import base64
import binascii
import re

# mnemory's defaults for a saved artifact.
DEFAULT_FILENAME = "note.md"
DEFAULT_CONTENT_TYPE = "text/markdown"
# mnemory: a read returns 5000 characters of text from `offset` by default.
DEFAULT_READ_LIMIT = 5000
MAX_FILENAME = 255
_MIME_PART = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_CONTENT_TYPE = re.compile(rf"^{_MIME_PART}/{_MIME_PART}(\s*;\s*[A-Za-z0-9_.-]+=[A-Za-z0-9_.\"-]+)*$")
_UNSAFE_FILENAME = re.compile(r"[\x00-\x1f\x7f\"\\/]")


class ContentError(ValueError):
    """The content, filename or content type is not acceptable (422)."""


def is_text(content_type: str) -> bool:
    return content_type.lower().startswith("text/")


def decode(content: str, content_type: str) -> bytes:
    """The bytes a save stores."""
    if is_text(content_type):
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ContentError("content must be base64 for a content_type other than text/*") from None


def decoded_size_bound(content: str, content_type: str) -> int:
    """An upper bound of the decoded size, without decoding (the gateway's early 413)."""
    if is_text(content_type):
        return len(content.encode("utf-8"))
    return (len(content) * 3) // 4


def check_content_type(content_type: str) -> str:
    value = content_type.strip()
    if not _CONTENT_TYPE.match(value):
        raise ContentError("content_type must be a MIME type such as text/markdown or image/png")
    return value


def clean_filename(filename: str) -> str:
    """The stored filename: no path, no quotes, no control characters (it goes into a
    Content-Disposition header and is never used to name a file on disk)."""
    name = _UNSAFE_FILENAME.sub("_", filename.strip())
    if not name or name in (".", ".."):
        raise ContentError("filename must not be empty")
    if len(name) > MAX_FILENAME:
        raise ContentError(f"filename is longer than {MAX_FILENAME} characters")
    return name


def read_page(data: bytes, content_type: str, offset: int, limit: int) -> dict[str, object]:
    """A GET's reply body: text paged by characters, binary whole as base64."""
    if is_text(content_type):
        text = data.decode("utf-8", errors="replace")
        return {
            "content": text[offset:offset + limit], "total_size": len(text), "offset": offset, "is_text": True,
            "has_more": offset + limit < len(text),
        }
    return {
        "content": base64.b64encode(data).decode("ascii"), "total_size": len(data), "offset": 0, "is_text": False,
        "has_more": False,
    }
