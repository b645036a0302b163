"""Reading the text tables of dataset folders (TUDataset ``.txt``, OGB ``.csv.gz``) and fetching
dataset archives, so that every failure -- a missing, truncated, malformed or hostile file, an
unreachable host -- is one :class:`~polygrad.errors.DataError` naming the file, never a raw
``ValueError`` / ``EOFError`` / ``BadZipFile``.
"""
from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.errors import DataError

__all__ = ["read_table", "download_zip", "MAX_ARCHIVE_BYTES"]

MAX_ARCHIVE_BYTES = 4 << 30  # an archive (or a member) claiming more than 4 GiB is refused unread


def _text(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:  # truncated / corrupt gzip, unreadable file
        raise DataError(f"{path}: cannot read ({type(exc).__name__}: {exc}); is the file truncated?") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc})") from None


def read_table(path: "str | os.PathLike[str]", dtype: Any, columns: int | None = None, *,
               allow_nan: bool = False) -> np.ndarray:
    """A comma-separated numeric table as a 2-D array ``[rows, columns]`` of ``dtype``.

    Blank lines are skipped; a row with another number of fields, a non-number, an integer
    that is not one (``1.5`` where ids are expected) or a non-finite float (unless
    ``allow_nan``) is a :class:`DataError` naming the file and the line.
    """
    path = Path(path)
    text = _text(path)
    want = np.dtype(dtype)
    if not text.strip():
        return np.empty((0, columns or 0), dtype=want)
    parse = np.int64 if want.kind in "iu" else np.float64
    try:
        with np.errstate(all="ignore"):
            table = np.loadtxt(io.StringIO(text), delimiter=",", dtype=parse, ndmin=2, comments=None)
    except (ValueError, OverflowError):
        _raise_bad_line(path, text, columns, parse)
    if table.size == 0:
        return np.empty((0, columns or 0), dtype=want)
    if columns is not None and table.shape[1] != columns:
        raise DataError(f"{path}: {table.shape[1]} columns, expected {columns}")
    if parse is np.float64 and not allow_nan and not np.isfinite(table).all():
        bad = int(np.flatnonzero(~np.isfinite(table).all(axis=1))[0])
        raise DataError(f"{path}: row {bad + 1} holds a non-finite number")
    return table.astype(want, copy=False)


def _raise_bad_line(path: Path, text: str, columns: int | None, parse: Any) -> None:
    """The first line numpy could not read, named (only called on failure: a Python loop is fine)."""
    width = columns
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(",")
        if width is None:
            width = len(fields)
        if len(fields) != width:
            raise DataError(f"{path}, line {number}: {len(fields)} fields, expected {width}")
        for field in fields:
            try:
                value = parse(field.strip()) if parse is np.float64 else int(field.strip())
                if parse is np.int64 and not -(1 << 63) <= value < (1 << 63):
                    raise OverflowError
            except (ValueError, OverflowError):
                kind = "an integer" if parse is np.int64 else "a number"
                raise DataError(f"{path}, line {number}: {field.strip()!r} is not {kind}") from None
    raise DataError(f"{path}: unreadable table")


def download_zip(url: str, folder: Path, expect: str, *, timeout: float = 60.0) -> Path:
    """Fetch the zip at ``url`` and unpack it into ``folder``; return ``folder / expect``.

    Members with absolute paths or ``..`` are refused (a zip cannot write outside ``folder``);
    the archive is unpacked into a temporary folder and moved into place, so an interrupted
    download leaves nothing under the final name.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the dataset folder {folder}: {exc}") from None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - a fixed https URL
            payload = resp.read(MAX_ARCHIVE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DataError(f"could not download {url} ({type(exc).__name__}: {exc}). Are you offline? Unpack the "
                        f"archive into {folder} by hand, or point the loader at a folder holding it") from None
    if len(payload) > MAX_ARCHIVE_BYTES:
        raise DataError(f"{url}: the archive is larger than {MAX_ARCHIVE_BYTES >> 30} GiB; refused")
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=folder))
    try:
        try:
            archive = zipfile.ZipFile(io.BytesIO(payload))
            members = archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise DataError(f"{url}: not a readable zip archive ({exc})") from None
        for m in members:
            parts = Path(m.filename).parts
            if m.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                raise DataError(f"{url}: archive member {m.filename!r} would be written outside {folder}; refused")
            if m.file_size > MAX_ARCHIVE_BYTES:
                raise DataError(f"{url}: archive member {m.filename!r} claims {m.file_size} bytes; refused")
        try:
            archive.extractall(tmp)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise DataError(f"{url}: cannot unpack ({type(exc).__name__}: {exc})") from None
        if not (tmp / expect).exists():
            raise DataError(f"{url}: the archive holds no {expect!r}")
        target = folder / expect
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp / expect, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
