"""Checkpoint locations: object-store URLs ("s3://bucket/prefix") told from paths (as
common/store_url.h does for the C++ client). A URL goes to the coordinator as it is: never made
absolute against the working directory, never looked up on the local filesystem."""

import os
import re

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_object_store_url(location):
    """True for a "scheme://..." string whose scheme is not file (s3://bucket/key)."""
    if not isinstance(location, str):
        return False
    m = _SCHEME.match(location)
    return m is not None and m.group(1) != "file"


def absolute(location):
    """An object-store URL unchanged; a path (str or os.PathLike) made absolute."""
    location = os.fspath(location)
    return location if is_object_store_url(location) else os.path.abspath(location)


def mangled_url(path):
    """The URL a pathlib.Path made of "s3://b/p" stands for ("s3:/b/p" -> "s3://b/p": DCP's
    FileSystemWriter/Reader keep their path as a Path), else None."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):/([^/].*)$", os.fspath(path))
    if m is None or m.group(1) == "file":
        return None
    return f"{m.group(1)}://{m.group(2)}"
