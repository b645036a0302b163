"""DLPack exchange: ``pg.from_dlpack`` and ``Tensor.__dlpack__`` (zero-copy where the data already is
where the target keeps its arrays; a copy otherwise; clear errors for what cannot be imported)."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.tensor import interop
from polygrad.errors import BackendUnavailableError, DTypeError


def test_numpy_import_is_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = pg.from_dlpack(a)
    assert t.backend == "numpy" and t.shape == (3, 4) and t.dtype == np.float32
    assert np.shares_memory(t.numpy(), a)
    a[1, 2] = -7.0  # shared storage: the producer's write is visible
    assert t.numpy()[1, 2] == -7.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.int64, np.uint8, np.bool_])
def test_dtypes_survive(dtype):
    a = (np.arange(6) % 3).astype(dtype)
    t = pg.from_dlpack(a)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), a)


def test_strided_and_zero_dim_views():
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    view = base[::2, 1::2]
    t = pg.from_dlpack(view)
    assert t.shape == (2, 3) and np.shares_memory(t.numpy(), base)
    np.testing.assert_array_equal(t.numpy(), view)
    # ops on a strided import give the same answer as on a copy
    np.testing.assert_allclose((t * 2).sum(axis=0).numpy(), (view * 2).sum(axis=0))
    s = pg.from_dlpack(np.array(3.5))
    assert s.shape == () and s.item() == 3.5


def test_tensor_exports_its_storage():
    t = pg.tensor(np.linspace(0, 1, 6).reshape(2, 3))
    a = np.from_dlpack(t)
    assert np.shares_memory(a, t._data)
    assert t.__dlpack_device__() == (interop.KDLCPU, 0)
    back = pg.from_dlpack(t)
    assert np.shares_memory(back._data, t._data)


def test_export_of_a_tensor_that_requires_grad_and_of_a_result():
    w = pg.tensor([[1.0, 2.0]], requires_grad=True)
    y = (w * 3).sum(axis=1)
    np.testing.assert_array_equal(np.from_dlpack(w), [[1.0, 2.0]])
    np.testing.assert_array_equal(np.from_dlpack(y), [9.0])
    imported = pg.from_dlpack(w, requires_grad=True)
    assert imported.requires_grad and imported.is_leaf and imported.grad is None


def test_scalar_backend_gets_a_copy_and_exports_a_host_copy():
    a = np.array([[1.0, -2.0], [3.0, 4.0]])
    t = pg.from_dlpack(a, backend="scalar")
    assert t.backend == "scalar"
    a[0, 0] = 100.0  # scalar storage is its own: unaffected
    np.testing.assert_array_equal(t.numpy(), [[1.0, -2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(np.from_dlpack(t), [[1.0, -2.0], [3.0, 4.0]])
    assert t.__dlpack_device__() == (interop.KDLCPU, 0)


def test_gradients_flow_through_an_imported_tensor():
    a = np.array([1.0, 2.0, 3.0])
    x = pg.from_dlpack(a, requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a)


def test_object_without_dlpack_is_refused():
    with pytest.raises(DTypeError, match="does not implement the DLPack protocol"):
        pg.from_dlpack([1.0, 2.0])
    capsule = np.arange(3.0).__dlpack__()
    with pytest.raises(DTypeError, match="PyCapsule"):
        pg.from_dlpack(capsule)


def test_unsupported_dtype_is_refused():
    with pytest.raises(DTypeError, match="unsupported dtype complex128"):
        pg.from_dlpack(np.array([1 + 2j]))


class _FakeProducer:
    """A DLPack producer claiming its data lives on a given device (never asked for the data
    when the device has no backend)."""

    def __init__(self, kind: int):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("the data should not be requested")


def test_gpu_data_without_a_gpu_backend_names_the_reason():
    cupy_info = {b.name: b for b in pg.list_backends()}["cupy"]
    if cupy_info.available:
        pytest.skip("a usable GPU is present")
    with pytest.raises(BackendUnavailableError, match="cupy") as err:
        pg.from_dlpack(_FakeProducer(interop.KDLCUDA))
    assert cupy_info.reason in str(err.value)
    with pytest.raises(BackendUnavailableError):  # to host memory needs cupy as well
        pg.from_dlpack(_FakeProducer(interop.KDLCUDA), backend="numpy")


def test_unknown_device_type_is_refused():
    with pytest.raises(BackendUnavailableError, match="device type 14"):
        pg.from_dlpack(_FakeProducer(14), backend="numpy")


def test_torch_tensors_zero_copy_and_detached():
    torch = pytest.importorskip("torch")
    src = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    t = pg.from_dlpack(src)
    assert t.backend == "numpy" and t.dtype == np.float64
    src[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0
    g = torch.ones(3, requires_grad=True)
    np.testing.assert_array_equal(pg.from_dlpack(g).numpy(), [1.0, 1.0, 1.0])
    back = torch.from_dlpack(t)
    assert back.data_ptr() == src.data_ptr()


def test_cupy_arrays_zero_copy_on_the_gpu():
    info = {b.name: b for b in pg.list_backends()}["cupy"]
    if not info.available:
        pytest.skip(f"cupy backend unavailable: {info.reason}")
    import cupy as cp
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    t = pg.from_dlpack(a)
    assert t.backend == "cupy" and t._data.data.ptr == a.data.ptr
    b = cp.from_dlpack(t)
    assert b.data.ptr == a.data.ptr
    host = pg.from_dlpack(a, backend="numpy")  # a device -> host copy
    np.testing.assert_array_equal(host.numpy(), cp.asnumpy(a))
    up = pg.from_dlpack(np.ones(3), backend="cupy")  # a host -> device copy
    assert up.backend == "cupy" and float(up.sum().item()) == 3.0
