"""Checkpoints: ``pg.save(obj, path)`` / ``pg.load(path)`` as ``.npz`` files, written atomically.

What can be saved: a tensor, a numpy array, or a nested structure of dicts (string keys),
lists/tuples, tensors, arrays, numbers, strings, booleans and ``None`` -- a model's
``state_dict()``, an optimizer's, or a dict holding both plus an epoch counter.  Sparse tensors
are saved as their pattern and values.

Format: a standard NumPy ``.npz`` (zip) file.  Every array is one member, named after its path
in the structure (``model/conv1.weight``); one more member, ``__polygrad__``, holds a small JSON
document describing the structure (types, dtypes, shapes, backends).  Nothing is pickled and
loading uses ``allow_pickle=False``, so a checkpoint from an untrusted source cannot run code.
The zip format's CRC-32 of every member catches corrupted files.

Atomicity: the file is written to a temporary file in the same folder, flushed and fsync'ed,
then renamed over the target with ``os.replace`` (atomic on POSIX and Windows), and the folder
is fsync'ed.  A crash at any point leaves either the old file or the new one, never a mix.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from . import sparse as sparse_mod
from .errors import CheckpointError, PolygradError
from .tensor import Tensor, tensor

__all__ = ["save", "load", "FORMAT", "VERSION"]

FORMAT = "polygrad-checkpoint"
VERSION = 1
_META = "__polygrad__"
_SAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def _is_tensor(obj: Any) -> bool:
    return isinstance(obj, Tensor)


class _Writer:
    """Walks the object, collecting arrays under unique member names and a JSON description."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def member(self, path: str, array: np.ndarray) -> str:
        if array.dtype == object or array.dtype.kind not in "biufc":
            raise CheckpointError(f"pg.save: {path or 'the object'} holds an array of dtype {array.dtype}; "
                                  "only numeric and bool arrays are saved (nothing is pickled)")
        base = _SAFE.sub("_", path.strip("/")) or "tensor"
        name, i = base, 1
        while name in self.arrays or name == _META:
            i += 1
            name = f"{base}~{i}"
        self.arrays[name] = np.ascontiguousarray(array)
        return name

    def encode(self, obj: Any, path: str) -> Any:
        if _is_tensor(obj):
            if getattr(obj, "layout", "dense") != "dense":
                return self.encode_sparse(obj, path)
            return {"__tensor__": self.member(path, obj.numpy()), "backend": obj.backend,
                    "requires_grad": bool(obj.requires_grad)}
        if isinstance(obj, np.ndarray):
            return {"__ndarray__": self.member(path, obj)}
        if isinstance(obj, np.generic):
            obj = obj.item()
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            # JSON has no NaN/Inf: spell them out
            return obj if np.isfinite(obj) else {"__float__": repr(obj)}
        if isinstance(obj, dict):
            out = {}
            for key, value in obj.items():
                if not isinstance(key, str):
                    raise CheckpointError(f"pg.save: dict keys must be strings, got {key!r} at {path or '/'}")
                out[key] = self.encode(value, f"{path}/{key}" if path else key)
            return {"__dict__": out}
        if isinstance(obj, (list, tuple)):
            items = [self.encode(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(obj)]
            return {"__tuple__" if isinstance(obj, tuple) else "__list__": items}
        raise CheckpointError(f"pg.save: cannot save a {type(obj).__name__} at {path or 'the top level'}; "
                              "supported: tensors, numpy arrays, dicts with string keys, lists, tuples, "
                              "numbers, strings, booleans and None")

    def encode_sparse(self, sp: Any, path: str) -> Any:
        pat = sp.pattern
        return {"__sparse__": {
            "indptr": self.member(f"{path}/indptr", np.asarray(pat.indptr)),
            "cols": self.member(f"{path}/cols", np.asarray(pat.cols)),
            "values": self.member(f"{path}/values", sp.values.numpy()),
        }, "shape": list(sp.shape), "layout": sp.layout, "backend": sp.backend,
            "requires_grad": bool(sp.requires_grad)}


def save(obj: Any, path: "str | os.PathLike[str]") -> None:
    """Write ``obj`` (a tensor or a nested state dict) to ``path`` as an ``.npz``, atomically.

    The file name is used exactly as given (no ``.npz`` is appended).  Raises
    :class:`~polygrad.errors.CheckpointError` for objects that cannot be saved without pickling,
    and ``OSError`` when the folder is not writable; in every failure case an existing file at
    ``path`` is left untouched.
    """
    writer = _Writer()
    tree = writer.encode(obj, "")
    meta = json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}).encode("utf-8")
    arrays = dict(writer.arrays)
    arrays[_META] = np.frombuffer(meta, dtype=np.uint8)

    target = Path(os.fspath(path))
    folder = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_npz(fh, arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


def _write_npz(fh: Any, arrays: dict[str, np.ndarray]) -> None:
    """The members, as ``np.savez`` writes them (one ``.npy`` per array in an uncompressed zip)."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


class _Reader:
    def __init__(self, npz: Any, path: str, backend: Any) -> None:
        self.npz = npz
        self.path = path
        self.backend = backend

    def array(self, name: Any) -> np.ndarray:
        if not isinstance(name, str) or name not in self.npz.files:
            raise CheckpointError(f"pg.load: {self.path} refers to a missing array {name!r}")
        arr = self.npz[name]
        if not isinstance(arr, np.ndarray):
            raise CheckpointError(f"pg.load: {self.path}: member {name!r} is not .npy array data")
        return arr

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            raise CheckpointError(f"pg.load: {self.path} has a malformed structure (bare list)")
        if not isinstance(node, dict) or len(node) == 0:
            raise CheckpointError(f"pg.load: {self.path} has a malformed structure")
        if "__tensor__" in node:
            arr = self.array(node["__tensor__"])
            t = tensor(arr, backend=self.backend)
            if node.get("requires_grad") and t.dtype.kind == "f":
                t.requires_grad_(True)
            return t
        if "__ndarray__" in node:
            return self.array(node["__ndarray__"])
        if "__float__" in node:
            return float(node["__float__"])
        if "__dict__" in node:
            return {k: self.decode(v) for k, v in dict(node["__dict__"]).items()}
        if "__list__" in node:
            return [self.decode(v) for v in node["__list__"]]
        if "__tuple__" in node:
            return tuple(self.decode(v) for v in node["__tuple__"])
        if "__sparse__" in node:
            return self.decode_sparse(node)
        raise CheckpointError(f"pg.load: {self.path} has an entry of unknown kind {sorted(node)}")

    def decode_sparse(self, node: dict) -> Any:
        parts = node["__sparse__"]
        indptr, cols, values = (self.array(parts[k]) for k in ("indptr", "cols", "values"))
        shape = tuple(int(s) for s in node["shape"])
        make = getattr(sparse_mod, "sparse_csr", None)
        if make is None:
            raise CheckpointError(f"pg.load: {self.path} holds a sparse tensor, and this polygrad has no "
                                  "sparse support")
        layout = node.get("layout", "csr")
        if layout not in ("csr", "coo"):
            raise CheckpointError(f"pg.load: {self.path} has a sparse tensor of unknown layout {layout!r}")
        try:
            sp = make(indptr, cols, values, shape, backend=self.backend, layout=layout, allow_nonfinite=True,
                      requires_grad=bool(node.get("requires_grad")) and values.dtype.kind == "f")
        except PolygradError as exc:
            raise CheckpointError(f"pg.load: {self.path} has a malformed sparse tensor: {exc}") from None
        return sp


def load(path: "str | os.PathLike[str]", backend: Any = None) -> Any:
    """Read a checkpoint written by :func:`save`.

    Tensors are created on ``backend`` (default: the current default backend).  Raises
    :class:`~polygrad.errors.CheckpointError` for a missing, truncated, corrupt or foreign file
    (anything that is not a polygrad checkpoint), never executing anything from it.
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise CheckpointError(f"pg.load: no checkpoint at {p}")
    try:
        with np.load(p, allow_pickle=False) as npz:
            if _META not in npz.files:
                raise CheckpointError(f"pg.load: {p} is an .npz but not a polygrad checkpoint "
                                      f"(no {_META} entry)")
            meta_raw = npz[_META]
            # a member that is not .npy data comes back as raw bytes
            if not isinstance(meta_raw, np.ndarray) or meta_raw.dtype != np.uint8 or meta_raw.ndim != 1:
                raise CheckpointError(f"pg.load: {p} has a malformed {_META} entry")
            meta = json.loads(meta_raw.tobytes().decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise CheckpointError(f"pg.load: {p} is not a polygrad checkpoint")
            if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
                raise CheckpointError(f"pg.load: {p} has format version {meta.get('version')!r}; this "
                                      f"polygrad reads versions up to {VERSION}")
            return _Reader(npz, p, backend).decode(meta.get("tree"))
    except CheckpointError:
        raise
    except PolygradError as exc:
        raise CheckpointError(f"pg.load: {p} could not be loaded: {exc}") from exc
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile,
            zipfile.LargeZipFile, UnicodeDecodeError, json.JSONDecodeError, NotImplementedError) as exc:
        # truncated zip, bad CRC, pickled (object) arrays refused by allow_pickle=False, bad JSON...
        raise CheckpointError(f"pg.load: {p} is corrupt or not a polygrad checkpoint "
                              f"({type(exc).__name__}: {exc})") from exc
