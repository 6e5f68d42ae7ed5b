"""Paths named by what a file says: kept under the folder they belong to.

A run folder's config.json and records, a suite result and a ledger are files a user may be
handed; a model or task name in them ("../../elsewhere", "/etc", "a/../../b") must not choose
where evalsuite reads or writes. A name taken from such a file becomes one path component
(`file_name`), or is refused when it must name an existing folder as it is (`beside`).
"""

from __future__ import annotations

import re
from pathlib import Path

from evalsuite.errors import UserError

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]+")  # what a file name keeps as it is: nothing that separates or escapes


def is_plain_name(name: str) -> bool:
    """Whether `name` is one path component on every system: not empty, `.` or `..`, and
    without a separator (/ or \\), a drive colon or a NUL."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\:\0")


def file_name(text: str) -> str:
    """`text` as one plain path component: runs of other characters than letters, digits and
    `._+=-` become `_`, and leading dots go (so `..` cannot climb); "_" when nothing is left."""
    name = _UNSAFE.sub("_", text).lstrip(".")
    return name or "_"


def beside(root: Path, name: str, what: str) -> Path:
    """`root / name` where `name` must be one plain component; one line saying `what` it is
    (the field of the file that holds it) otherwise."""
    if not is_plain_name(name):
        raise UserError(f"{what} is {name!r}, which cannot name a folder in {root}")
    return root / name
