"""The Planetoid citation graphs (Cora, CiteSeer, PubMed), read without torch, through a restricted unpickler.

The files are the original Planetoid ones (``ind.<name>.x``, ``tx``, ``allx``, ``y``, ``ty``,
``ally``, ``graph``, ``test.index``; Yang, Cohen & Salakhutdinov, ICML 2016).  All but
``test.index`` are Python 2 pickles.  Unpickling runs code chosen by the file, so this module
never calls ``pickle.load``: it uses :class:`RestrictedUnpickler`, which admits only the handful
of globals these files reference (numpy's array reconstruction, ``collections.defaultdict``,
harmless builtins) and maps scipy's ``csr_matrix`` class to a local stand-in that merely
captures the pickled state (scipy's own class is never loaded from a file).  Any other global is
refused with :class:`polygrad.errors.DataError` *before* it is looked up, so nothing a hostile
file asks for runs.

Assembly reproduces PyTorch Geometric's ``torch_geometric.io.read_planetoid_data``:

* ``train`` = node ids ``0 .. len(y)-1`` (Cora 140, CiteSeer 120, PubMed 60);
  ``val`` = the next 500 ids; ``test`` = the ids listed in ``test.index``.
* features = ``vstack(allx, tx)`` and labels = ``argmax(vstack(ally, ty))``, where the test
  block is first re-ordered so that the row of ``tx`` listed ``k``-th in ``test.index`` lands
  on node ``test.index[k]`` (PyG's ``x[test_index] = x[sorted_test_index]``).
* If the test ids are not one contiguous range (CiteSeer: 15 isolated ids have no row), the
  test block is padded to ``min..max`` of ``test.index`` with zero feature rows and all-zero
  label rows, whose argmax is class 0 (PyG does this for ``citeseer`` by name; here it is done
  whenever the ids have gaps, which is the same thing for the three datasets).
* edges: every ``(k, v)`` for ``v`` in ``graph[k]``; **self loops are removed** and duplicates
  dropped, then sorted by (source, target) (PyG's ``remove_self_loops`` + ``coalesce`` in
  ``edge_index_from_dict``).  No symmetrisation is applied, exactly as in PyG; the Cora and
  CiteSeer graphs are symmetric after deduplication anyway (checked by the tests).
  Cora: 10,556 edges, CiteSeer: 9,104.

Features are kept sparse (:class:`~polygrad.data.csr.CSRMatrix`, float32 as stored in
the files, column indices sorted, duplicates summed); ``x_dense()`` gives PyG's dense ``x``.
"""
from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from polygrad.runtime import memory
from polygrad.ir.errors import DataError, MemoryBudgetError, SparseIndexError

from .csr import CSRMatrix, unique_sorted
from .graph_dataset import GraphDataset
from .edge_index import index_to_mask

__all__ = [
    "PlanetoidDataset",
    "load_planetoid",
    "download_planetoid",
    "read_planetoid_file",
    "RestrictedUnpickler",
    "PLANETOID_NAMES",
    "PLANETOID_PARTS",
    "PLANETOID_URL",
    "default_cache_dir",
]

#: Canonical dataset names (lower case) and their display names.
PLANETOID_NAMES: dict[str, str] = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
#: The eight file suffixes, in the order PyG reads them.
PLANETOID_PARTS: tuple[str, ...] = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
#: Where the files are published (the source PyG's ``Planetoid`` downloads from).
PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"

# SHA-256 of the published files (kimiyoung/planetoid, data last changed in commit 42d4a8b).
# Downloads of these are verified; PubMed's hashes were not available to us, so PubMed
# downloads are checked only by parsing (the unpickler is restricted either way).
_KNOWN_SHA256: dict[str, str] = {
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
}

_NUM_VAL = 500


# ----------------------------------------------------------------------------------------------
# restricted unpickling
# ----------------------------------------------------------------------------------------------


class _SparseStandIn:
    """Captures the pickled state of a scipy sparse matrix without importing scipy.

    Protocol-2 pickles create it through ``cls.__new__(cls)`` (NEWOBJ) and fill it with the
    state dict (BUILD updates ``__dict__``); nothing else is ever called on it.
    """

    _scipy_name = "csr_matrix"

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise DataError(f"pickled {self._scipy_name} has non-dict state ({type(state).__name__})")
        self.__dict__["_state"] = dict(state)

    def to_csr(self) -> CSRMatrix:
        """Turn the captured scipy state into a :class:`CSRMatrix` (validated, canonical)."""
        state = self.__dict__.get("_state")
        if state is None:
            raise DataError(f"pickled {self._scipy_name} carries no state")
        fmt = state.get("format", "csr")
        if fmt != "csr":
            raise DataError(f"pickled sparse matrix has format {fmt!r}, expected 'csr'")
        shape = state.get("_shape", state.get("shape"))
        missing = [k for k in ("data", "indices", "indptr") if not isinstance(state.get(k), np.ndarray)]
        if shape is None or missing:
            raise DataError(f"pickled {self._scipy_name} lacks "
                            f"{', '.join(missing + (['shape'] if shape is None else []))}")
        if not (isinstance(shape, tuple) and len(shape) == 2
                and all(isinstance(s, (int, np.integer)) for s in shape)):
            raise DataError(f"pickled {self._scipy_name} has a bad shape {shape!r}")
        try:
            return CSRMatrix(state["indptr"], state["indices"], state["data"], shape).canonical()
        except SparseIndexError as exc:
            raise DataError(f"pickled {self._scipy_name} is malformed: {exc}") from exc


class _CsrArrayStandIn(_SparseStandIn):
    _scipy_name = "csr_array"


def _safe_copyreg_reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """Stand-in for ``copyreg._reconstructor`` (protocol 0/1 pickles of new-style objects).

    Only our stand-in classes on top of ``object`` are allowed: the real function would call
    ``base.__new__`` / ``base.__init__`` of whatever the file names.
    """
    if not (isinstance(cls, type) and issubclass(cls, _SparseStandIn) and base is object
            and state is None):
        raise DataError("refusing copyreg._reconstructor for anything but a scipy sparse matrix")
    return cls.__new__(cls)


def _safe_codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Stand-in for ``_codecs.encode`` as Python 3 uses it in protocol <= 2 pickles of
    ``bytes`` (``_codecs.encode(text, "latin1")``); any other codec is refused."""
    if not isinstance(obj, str) or encoding.lower().replace("_", "-") not in ("latin1", "latin-1"):
        raise DataError(f"refusing _codecs.encode with codec {encoding!r}")
    return obj.encode("latin1")


class _Guarded:
    """Wraps a stand-in callable so a pickle cannot alter it.

    Pickle's BUILD opcode may be applied to any object on the stack, including the callables
    ``find_class`` returns; on a plain Python function it could overwrite ``__defaults__``.
    This wrapper has no ``__dict__`` and refuses ``__setstate__``.
    """

    __slots__ = ("_fn",)
    _fn: Any

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __setattr__(self, name: str, value: Any) -> None:
        raise DataError("refusing to modify a loader function")

    def __setstate__(self, state: Any) -> None:
        raise DataError("refusing to modify a loader function")


def _budget(what: str, nbytes: int) -> None:
    """DataError (not an allocation) when a file asks for more than the memory budget."""
    try:
        memory.check("load_planetoid", nbytes, what=what)
    except MemoryBudgetError as exc:
        raise DataError(f"refused: {exc}") from None


def _sized(fn: Any, name: str) -> Any:
    """``bytes``/``bytearray`` for pickles, without the size form: ``bytearray(3_000_000_000)``
    asks for memory the file does not contain (pickled data always passes its content)."""
    def make(*args: Any) -> Any:
        if args and isinstance(args[0], int):
            raise DataError(f"refused: the pickle calls {name}({args[0]}), asking for {args[0]} bytes "
                            "that the file does not contain (Planetoid pickles pass their data)")
        return fn(*args)
    return make


def _empty_reconstruct(recon_fn: Any) -> Any:
    """numpy's ``_reconstruct(cls, shape, dtype)`` allocates ``shape`` at once; numpy's own
    pickles pass shape (0,) and fill the array from the file's bytes in ``__setstate__``
    (which checks them), so any other shape is a hostile allocation request."""
    def reconstruct(cls: Any, shape: Any, dtype: Any) -> Any:
        try:
            n = 1
            for s in (shape if isinstance(shape, (tuple, list)) else (shape,)):
                n *= int(s)
        except Exception as exc:  # noqa: BLE001 - whatever the pickle passed, it is malformed
            raise DataError(f"malformed pickled array header ({type(exc).__name__}: {exc})") from None
        if n != 0:
            raise DataError(f"refused: the pickle reconstructs an array of shape {shape!r:.60} before "
                            "its data (numpy's own pickles start from an empty one)")
        return recon_fn(cls, shape, dtype)
    return reconstruct


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The numpy globals numpy's own pickles use, resolved from numpy itself."""
    recon_fn, _args = cast(tuple, np.zeros(1).__reduce__())[:2]  # an array reduces to a tuple
    scalar_fn = np.float64(0).__reduce__()[0]
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray,
                                           ("numpy", "dtype"): np.dtype}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = _Guarded(_empty_reconstruct(recon_fn))
        allowed[(mod, "scalar")] = scalar_fn
    return allowed


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **_numpy_globals(),
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("copy_reg", "_reconstructor"): _Guarded(_safe_copyreg_reconstructor),
    ("copyreg", "_reconstructor"): _Guarded(_safe_copyreg_reconstructor),
    ("_codecs", "encode"): _Guarded(_safe_codecs_encode),
}
for _mod in ("builtins", "__builtin__"):
    for _name, _obj in (("list", list), ("dict", dict), ("tuple", tuple), ("set", set),
                        ("frozenset", frozenset), ("int", int), ("long", int), ("float", float),
                        ("complex", complex), ("bool", bool), ("str", str), ("unicode", str),
                        ("bytes", bytes), ("bytearray", bytearray), ("object", object)):
        _ALLOWED_GLOBALS[(_mod, _name)] = (_Guarded(_sized(_obj, _name)) if _obj in (bytes, bytearray)
                                           else _obj)
for _mod in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse"):
    _ALLOWED_GLOBALS[(_mod, "csr_matrix")] = _SparseStandIn
    _ALLOWED_GLOBALS[(_mod, "csr_array")] = _CsrArrayStandIn
del _mod, _name, _obj


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only an allow-list of globals.

    Admitted: numpy's array/dtype/scalar reconstruction (``numpy.core.multiarray._reconstruct``
    or ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``,
    ``...multiarray.scalar``), ``collections.defaultdict``/``OrderedDict``, plain builtin
    containers and numbers, ``_codecs.encode`` restricted to latin-1 (how Python 3 writes
    ``bytes`` in protocol-2 pickles), and scipy's ``csr_matrix``/``csr_array`` (mapped to local
    stand-ins; scipy is not imported).  Everything else raises
    :class:`polygrad.errors.DataError` naming the source and the global.

    Parameters
    ----------
    file:
        Binary file object.
    source:
        Name used in error messages (usually the file path).
    """

    def __init__(self, file: Any, source: str = "<pickle>") -> None:
        super().__init__(file, encoding="latin1", fix_imports=True)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle API
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(f"{self._source}: refusing to load forbidden global "
                            f"{module}.{name} (only numpy arrays, scipy CSR matrices and plain "
                            f"containers are allowed in Planetoid files)") from None

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"{self._source}: persistent ids are not allowed in Planetoid files")


def _unpickle(data: bytes, source: str) -> Any:
    try:
        obj = RestrictedUnpickler(io.BytesIO(data), source).load()
    except DataError as exc:
        if str(exc).startswith(source):
            raise
        raise DataError(f"{source}: {exc}") from None
    except RecursionError as exc:
        raise DataError(f"{source}: pickle nests too deeply") from exc
    except MemoryError as exc:
        raise DataError(f"{source}: pickle asks for more memory than is available") from exc
    except Exception as exc:  # truncated/corrupt pickles raise many different types
        raise DataError(f"{source}: not a readable Planetoid pickle "
                        f"({type(exc).__name__}: {exc})") from exc
    return obj


def read_planetoid_file(path: str | os.PathLike, part: str | None = None) -> Any:
    """Read one Planetoid file safely.

    Parameters
    ----------
    path:
        The file (``ind.<name>.<part>``).
    part:
        Which part it is (``"x"``, ``"tx"``, ``"allx"``, ``"y"``, ``"ty"``, ``"ally"``,
        ``"graph"`` or ``"test.index"``); default: taken from the file name.

    Returns
    -------
    CSRMatrix | numpy.ndarray | dict[int, list[int]]
        ``CSRMatrix`` for the feature parts, an int64 ``[n, C]`` one-hot array for the label
        parts, a ``dict`` node -> neighbour list for ``graph``, an int64 1-D array for
        ``test.index``.

    Raises
    ------
    DataError
        Missing, unreadable, truncated, malformed or unsafe file.
    """
    p = Path(path)
    if part is None:
        part = next((s for s in PLANETOID_PARTS if p.name.endswith("." + s)), None)
        if part is None:
            raise DataError(f"{p}: cannot tell which Planetoid part this is; pass part=")
    if part not in PLANETOID_PARTS:
        raise DataError(f"unknown Planetoid part {part!r}; expected one of {PLANETOID_PARTS}")
    try:
        _budget(f"the file {p}", p.stat().st_size)
        raw = p.read_bytes()
    except FileNotFoundError:
        raise DataError(f"Planetoid file not found: {p}") from None
    except OSError as exc:
        raise DataError(f"cannot read Planetoid file {p}: {exc}") from exc
    src = str(p)

    if part == "test.index":
        try:
            text = raw.decode("ascii")
            ids = [int(tok) for tok in text.split()]
            arr = np.asarray(ids, dtype=np.int64)
        except (UnicodeDecodeError, ValueError, OverflowError) as exc:
            raise DataError(f"{src}: test.index must hold one int64 node id per line ({exc})") from exc
        if not ids:
            raise DataError(f"{src}: test.index is empty")
        if arr.min() < 0:
            raise DataError(f"{src}: test.index holds negative node ids")
        if unique_sorted(arr).size != arr.size:
            raise DataError(f"{src}: test.index lists a node more than once")
        return arr

    obj = _unpickle(raw, src)
    if part in ("x", "tx", "allx"):
        if not isinstance(obj, _SparseStandIn):
            raise DataError(f"{src}: expected a scipy csr_matrix, got {type(obj).__name__}")
        try:
            csr = obj.to_csr()
        except DataError as exc:
            raise DataError(f"{src}: {exc}") from exc
        if csr.data.dtype.kind not in "biuf":
            raise DataError(f"{src}: feature values have dtype {csr.data.dtype}")
        if not np.all(np.isfinite(csr.data)):
            raise DataError(f"{src}: feature values contain NaN or Inf")
        return csr
    if part in ("y", "ty", "ally"):
        if not isinstance(obj, np.ndarray) or obj.ndim != 2 or obj.dtype.kind not in "biuf":
            raise DataError(f"{src}: expected a 2-D numeric one-hot label array, got "
                            f"{type(obj).__name__} {getattr(obj, 'dtype', '')} "
                            f"{getattr(obj, 'shape', '')}")
        if not np.all(np.isfinite(obj)):
            raise DataError(f"{src}: labels contain NaN or Inf")
        return obj
    # graph
    if not isinstance(obj, dict):
        raise DataError(f"{src}: expected a dict of adjacency lists, got {type(obj).__name__}")
    graph: dict[int, list[int]] = {}
    for k, v in obj.items():
        if not _is_int(k) or not isinstance(v, (list, tuple)) or not all(_is_int(u) for u in v):
            raise DataError(f"{src}: graph must map int node ids to lists of int ids "
                            f"(bad entry for key {k!r})")
        graph[int(k)] = [int(u) for u in v]
    return graph


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


# ----------------------------------------------------------------------------------------------
# dataset assembly
# ----------------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class PlanetoidDataset(GraphDataset):
    """A Planetoid citation graph; see :class:`~polygrad.data.graph_dataset.GraphDataset`.

    Adds ``test_index`` (int64, the ids of ``test.index`` in file order) and ``root`` (the
    folder the files came from).
    """

    test_index: np.ndarray | None = None
    root: str | None = None


def _canonical_name(name: Any) -> str:
    if not isinstance(name, str):
        raise DataError(f"Planetoid dataset name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in PLANETOID_NAMES:
        raise DataError(f"unknown Planetoid dataset {name!r}; expected one of "
                        f"{', '.join(PLANETOID_NAMES.values())} (case-insensitive)")
    return key


def default_cache_dir() -> Path:
    """``$POLYGRAD_CACHE_DIR/planetoid`` if set, else ``~/.cache/polygrad/planetoid``."""
    env = os.environ.get("POLYGRAD_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "polygrad"
    return base / "planetoid"


def find_planetoid_dir(*candidates: "str | os.PathLike[str]", name: str = "cora") -> Path | None:
    """The first folder holding ``ind.<name>.*``: ``$POLYGRAD_PLANETOID_DIR``, then ``candidates``
    (e.g. a checkout's ``../shared/data/planetoid``), then the download cache; None if none does."""
    env = os.environ.get("POLYGRAD_PLANETOID_DIR")
    for folder in ([Path(env)] if env else []) + [Path(c) for c in candidates] + [default_cache_dir()]:
        if (folder / f"ind.{name}.graph").is_file():
            return folder
    return None


def _file_names(key: str) -> list[str]:
    return [f"ind.{key}.{part}" for part in PLANETOID_PARTS]


def _missing(folder: Path, key: str) -> list[str]:
    return [f for f in _file_names(key) if not (folder / f).is_file()]


def download_planetoid(name: str = "cora", cache_dir: str | os.PathLike | None = None, *,
                       base_url: str = PLANETOID_URL, timeout: float = 60.0) -> Path:
    """Download the eight files of a Planetoid dataset into ``cache_dir``.

    Files already present are kept.  Each file is written to a temporary file in the same
    folder and moved into place with ``os.replace``, so an interrupted download never leaves a
    partial file under the final name.  Files with a known SHA-256 (Cora, CiteSeer) are
    verified before they are moved into place.

    Parameters
    ----------
    name:
        ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (case-insensitive).
    cache_dir:
        Destination folder; default :func:`default_cache_dir`.
    base_url:
        Folder URL the files are fetched from (``<base_url>/ind.<name>.<part>``).
    timeout:
        Seconds per request.

    Returns
    -------
    pathlib.Path
        The folder holding the files.

    Raises
    ------
    DataError
        Offline / unreachable host / HTTP error / hash mismatch / unwritable folder.
    """
    key = _canonical_name(name)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the Planetoid cache folder {folder}: {exc}") from exc
    for fname in _missing(folder, key):
        url = f"{base_url.rstrip('/')}/{fname}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
                payload = resp.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise DataError(
                f"could not download {url} ({type(exc).__name__}: {exc}). Are you offline? "
                f"Copy the Planetoid files (ind.{key}.*) into {folder} by hand, or pass "
                f"root=<folder holding them> to load_planetoid.") from exc
        want = _KNOWN_SHA256.get(fname)
        if want is not None and hashlib.sha256(payload).hexdigest() != want:
            raise DataError(f"downloaded {url} does not match its known SHA-256; not saved")
        fd, tmp = tempfile.mkstemp(prefix=f".{fname}.", suffix=".part", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, folder / fname)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise DataError(f"cannot write {folder / fname}: {exc}") from exc
    return folder


def load_planetoid(root: str | os.PathLike | None = None, name: str = "cora", *,
                   download: bool = False,
                   cache_dir: str | os.PathLike | None = None) -> PlanetoidDataset:
    """Load Cora, CiteSeer or PubMed in the standard Planetoid split (as PyG does).

    Parameters
    ----------
    root:
        Folder holding ``ind.<name>.*``.  If ``None``, ``cache_dir`` is used (and filled first
        when ``download=True``).
    name:
        ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (case-insensitive; ``"CiteSeer"`` works).
    download:
        With ``root=None``, fetch missing files from :data:`PLANETOID_URL` into ``cache_dir``.
        Ignored when ``root`` is given (an explicit folder is never written to).
    cache_dir:
        Cache folder; default :func:`default_cache_dir` (``~/.cache/polygrad/planetoid``).

    Returns
    -------
    PlanetoidDataset
        Cora: 2708 nodes, 1433 features, 7 classes, 10556 directed edges, split 140/500/1000.
        CiteSeer: 3327 nodes, 3703 features, 6 classes, 9104 edges, split 120/500/1000.

    Raises
    ------
    DataError
        Unknown name, missing files (the message says how to get them), unreadable, corrupt or
        unsafe files, or files that do not fit together.
    """
    key = _canonical_name(name)
    if root is not None:
        folder = Path(root)
        missing = _missing(folder, key)
        if missing:
            raise DataError(f"Planetoid {PLANETOID_NAMES[key]}: missing {', '.join(missing)} in "
                            f"{folder}")
    else:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        if download:
            download_planetoid(key, folder)
        missing = _missing(folder, key)
        if missing:
            raise DataError(
                f"Planetoid {PLANETOID_NAMES[key]} is not in the cache {folder} (missing "
                f"{', '.join(missing)}). Either pass root=<folder holding the ind.{key}.* files>, "
                f"or load_planetoid(name={key!r}, download=True) to fetch them from "
                f"{PLANETOID_URL}.")
    parts = {part: read_planetoid_file(folder / f"ind.{key}.{part}", part) for part in PLANETOID_PARTS}
    return _assemble(key, parts, str(folder))


def _assemble(key: str, parts: dict[str, Any], root: str) -> PlanetoidDataset:
    """PyG's ``read_planetoid_data``, in numpy."""
    where = f"Planetoid {PLANETOID_NAMES[key]} ({root})"
    tx: CSRMatrix = parts["tx"]
    allx: CSRMatrix = parts["allx"]
    y, ty, ally = parts["y"], parts["ty"], parts["ally"]
    graph: dict[int, list[int]] = parts["graph"]
    test_index: np.ndarray = parts["test.index"]

    num_features = allx.shape[1]
    num_classes = ally.shape[1]
    if tx.shape[1] != num_features or parts["x"].shape[1] != num_features:
        raise DataError(f"{where}: feature widths differ (x {parts['x'].shape}, tx {tx.shape}, "
                        f"allx {allx.shape})")
    if ty.shape[1] != num_classes or y.shape[1] != num_classes:
        raise DataError(f"{where}: label widths differ (y {y.shape}, ty {ty.shape}, "
                        f"ally {ally.shape})")
    if ally.shape[0] != allx.shape[0] or ty.shape[0] != tx.shape[0]:
        raise DataError(f"{where}: feature and label row counts differ (allx {allx.shape[0]} vs "
                        f"ally {ally.shape[0]}, tx {tx.shape[0]} vs ty {ty.shape[0]})")
    if test_index.shape[0] != tx.shape[0]:
        raise DataError(f"{where}: test.index has {test_index.shape[0]} ids but tx has "
                        f"{tx.shape[0]} rows")

    sorted_test = np.sort(test_index)
    lo, hi = int(sorted_test[0]), int(sorted_test[-1])
    span = hi - lo + 1
    if lo != allx.shape[0]:
        raise DataError(f"{where}: the smallest test id ({lo}) should equal the number of allx "
                        f"rows ({allx.shape[0]})")
    # the padded test block, the node arrays and the edge keys grow with the id range, which a
    # hostile test.index can make 10^12 wide: budgeted before anything of that size exists
    try:
        _budget(f"{where}: test ids spanning {span} nodes", (lo + span) * (8 * 6 + 8 * num_classes))
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    if span != test_index.shape[0]:
        # Isolated test ids without a row (CiteSeer): pad the block to the full id range;
        # row k of tx goes to slot sorted_test[k] - lo, exactly as PyG's tx_ext does.
        slots = np.full(span, -1, dtype=np.int64)
        slots[sorted_test - lo] = np.arange(tx.shape[0])
        have = slots >= 0
        order = np.where(have, slots, 0)
        tx_rows = tx.take_rows(order)
        keep = np.repeat(have, np.diff(tx_rows.indptr))
        counts = np.where(have, np.diff(tx_rows.indptr), 0)
        indptr = np.zeros(span + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        tx = CSRMatrix(indptr, tx_rows.indices[keep], tx_rows.data[keep], (span, num_features))
        ty_ext = np.zeros((span, num_classes), dtype=ty.dtype)
        ty_ext[sorted_test - lo] = ty
        ty = ty_ext

    x = CSRMatrix.vstack([allx, tx])
    labels = np.argmax(np.concatenate([ally, ty], axis=0), axis=1).astype(np.int64)
    num_nodes = x.shape[0]

    # x[test_index] = x[sorted_test_index]  (and the same for labels)
    perm = np.arange(num_nodes, dtype=np.int64)
    perm[test_index] = sorted_test
    x = x.take_rows(perm)
    labels = labels[perm]

    n_train = y.shape[0]
    if n_train + _NUM_VAL > num_nodes:
        raise DataError(f"{where}: {n_train} train + {_NUM_VAL} val ids exceed {num_nodes} nodes")
    train_mask = index_to_mask(np.arange(n_train), num_nodes)
    val_mask = index_to_mask(np.arange(n_train, n_train + _NUM_VAL), num_nodes)
    test_mask = index_to_mask(test_index, num_nodes)

    edge_index = _edge_index_from_dict(graph, num_nodes, where)
    return PlanetoidDataset(name=key, x=x, y=labels, edge_index=edge_index,
                            train_mask=train_mask, val_mask=val_mask, test_mask=test_mask,
                            num_classes=num_classes, test_index=test_index, root=root)


def _edge_index_from_dict(graph: dict[int, list[int]], num_nodes: int, where: str) -> np.ndarray:
    """PyG's ``edge_index_from_dict``: all (k, v) pairs, self loops removed, coalesced."""
    lens = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
    try:
        keys = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        col = np.fromiter((u for v in graph.values() for u in v), dtype=np.int64, count=int(lens.sum()))
    except OverflowError:
        raise DataError(f"{where}: the graph refers to node ids outside [0, {num_nodes})") from None
    row = np.repeat(keys, lens)
    if row.size and (min(row.min(), col.min()) < 0 or max(row.max(), col.max()) >= num_nodes):
        raise DataError(f"{where}: the graph refers to node ids outside [0, {num_nodes})")
    keep = row != col
    key = unique_sorted(row[keep] * num_nodes + col[keep])
    return np.stack([key // num_nodes, key % num_nodes]).astype(np.int64)
