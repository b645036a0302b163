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

Crash leftovers: a writer holds an exclusive ``flock`` on its temporary file until the rename.
A save killed mid-write leaves its temporary (``.NAME.XXXXXXXX.tmp``) behind; the next
``save`` or ``load`` of the same target removes every such temporary that no live writer holds
(the lock proves the writer is gone; where ``flock`` does not exist, only temporaries older
than an hour are removed).

Hostile files: ``load`` raises only :class:`~polygrad.errors.CheckpointError` -- whatever the
bytes, nesting or sizes -- and reads each member's ``.npy`` header first: a member whose header
claims more data than the member holds, or more than the memory budget allows (``pg.memory``),
is refused before anything is allocated.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime import memory
from .. import sparse as sparse_mod
from ..ir.errors import CheckpointError, MemoryBudgetError, PolygradError
from ..tensor import Tensor, tensor

try:  # POSIX: a live writer's temporary is told from a dead one's by its lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

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
    remove_stale_temporaries(target)
    fd, tmp = _locked_temporary(target, folder)
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


#: where flock is unavailable, a temporary this old is taken as a dead writer's
_STALE_SECONDS = 3600


def _temporary_pattern(target: Path) -> re.Pattern:
    # exactly what tempfile.mkstemp(prefix=".NAME.", suffix=".tmp") creates: 8 random characters
    return re.compile(re.escape(f".{target.name}.") + r"[a-z0-9_]{8}" + re.escape(".tmp"))


def _locked_temporary(target: Path, folder: Path) -> tuple[int, str]:
    """A new temporary beside ``target``, exclusively locked for as long as this writer lives."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        if fcntl is None:
            return fd, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # a cleaner may have removed it between mkstemp and flock: then take another
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return fd, tmp
        except OSError:
            pass
        os.close(fd)


def remove_stale_temporaries(target: "str | os.PathLike[str]") -> list[str]:
    """Remove the temporaries that killed saves of ``target`` left behind; returns their paths.

    Only files named like this module's temporaries for exactly this target are considered, and
    only those that no live writer holds (a non-blocking ``flock`` succeeds on them).  Errors
    (a read-only folder, a file that vanished) are ignored: cleaning is best effort."""
    target = Path(os.fspath(target))
    folder = target.parent if str(target.parent) else Path(".")
    pattern = _temporary_pattern(target)
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        tmp = folder / name
        try:
            if fcntl is None:
                if time.time() - os.stat(tmp).st_mtime > _STALE_SECONDS:
                    os.unlink(tmp)
                    removed.append(str(tmp))
                continue
            fd = os.open(tmp, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live writer, leave it
                os.unlink(tmp)
                removed.append(str(tmp))
            finally:
                os.close(fd)
        except OSError:
            continue
    return removed


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
        self.check_member(name)
        arr = self.npz[name]
        if not isinstance(arr, np.ndarray):
            raise CheckpointError(f"pg.load: {self.path}: member {name!r} is not .npy array data")
        return arr

    def check_member(self, name: str) -> None:
        """Refuse member ``name`` before numpy allocates it: its header must fit the member's
        bytes and the memory budget (a header can claim 10^12 elements in a 100-byte file, a
        deflated member can inflate to terabytes)."""
        zf = self.npz.zip
        try:
            info = zf.getinfo(name + ".npy")
        except KeyError:
            return  # not an .npy member: numpy returns its raw bytes, which the caller refuses
        what = f"member {name!r} of {self.path}"
        try:
            memory.check("pg.load", info.file_size, what=f"{what} ({info.file_size} bytes once inflated)")
            with zf.open(info) as fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
                header = fh.tell()
        except MemoryBudgetError as exc:
            raise CheckpointError(f"pg.load: {what} is refused: {exc}") from None
        if dtype.hasobject:
            raise CheckpointError(f"pg.load: {what} holds Python objects (dtype {dtype}); nothing is unpickled")
        claimed = math.prod(shape) * dtype.itemsize
        if claimed > info.file_size - header:
            raise CheckpointError(f"pg.load: {what} claims a {dtype} array of shape {shape} ({claimed} bytes) "
                                  f"but holds {info.file_size - header} bytes of data: corrupt or hostile")
        # claimed <= file_size, which has passed the budget above: no second check needed

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
    :class:`~polygrad.errors.CheckpointError` -- and nothing else -- for a missing, truncated,
    corrupt, hostile or foreign file (anything that is not a polygrad checkpoint), never
    executing anything from it, and refuses members over the memory budget before allocating.
    Stale temporaries of killed saves of ``path`` are removed first.
    """
    try:
        p = os.fsdecode(os.fspath(path))
        remove_stale_temporaries(p)
        found = os.path.isfile(p)
    except (TypeError, ValueError) as exc:  # not a path, or one with a NUL byte
        raise CheckpointError(f"pg.load: not a usable path: {type(path).__name__} {path!r:.80}") from exc
    if not found:
        raise CheckpointError(f"pg.load: no checkpoint at {p}")
    try:
        with np.load(p, allow_pickle=False) as npz:
            if _META not in npz.files:
                raise CheckpointError(f"pg.load: {p} is an .npz but not a polygrad checkpoint "
                                      f"(no {_META} entry)")
            reader = _Reader(npz, p, backend)
            reader.check_member(_META)  # the description is budgeted like any member
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
            return reader.decode(meta.get("tree"))
    except CheckpointError:
        raise
    except PolygradError as exc:
        raise CheckpointError(f"pg.load: {p} could not be loaded: {exc}") from exc
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile,
            zipfile.LargeZipFile, UnicodeDecodeError, json.JSONDecodeError, NotImplementedError) as exc:
        # truncated zip, bad CRC, pickled (object) arrays refused by allow_pickle=False, bad JSON...
        raise CheckpointError(f"pg.load: {p} is corrupt or not a polygrad checkpoint "
                              f"({type(exc).__name__}: {exc})") from exc
    except RecursionError:
        raise CheckpointError(f"pg.load: {p} nests its structure deeper than Python can follow; "
                              "refused") from None
    except MemoryError as exc:  # an allocation the budget let through still failed
        raise CheckpointError(f"pg.load: {p} could not be loaded: out of memory ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the contract: a hostile file raises CheckpointError only
        raise CheckpointError(f"pg.load: {p} is corrupt or not a polygrad checkpoint "
                              f"({type(exc).__name__}: {exc})") from exc
