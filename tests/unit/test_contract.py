"""The backend contract is complete (a third party takes part in DLPack, memory reporting, the
default and the fallback chain with no core change), and the public seams replace private reaches:
pluggy's check for misspelled hooks, only marked implementations, kernel lookup, ``Tensor.update_``,
``pg.rng``."""
from __future__ import annotations

import types

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.backend import KDLCPU
from polygrad.errors import BackendUnavailableError, ShapeError
from polygrad.runtime.registry import registry

FAKE_DEVICE = 14  # a DLPack device type no built-in backend takes


class _OnFakeDevice:
    """A DLPack producer whose data lives on FAKE_DEVICE (a numpy array underneath)."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (FAKE_DEVICE, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("only the device's own backend may read the data")


class _DeviceArray:
    def __init__(self, array):
        self.array = np.asarray(array)
        self.shape, self.dtype = self.array.shape, self.array.dtype


class DeviceBackend(pg.Backend):
    """A third-party 'accelerator' backend: its own array type, its own DLPack device and memory."""
    name = "test-device"
    dlpack_devices = (FAKE_DEVICE,)
    fallback_chain = ("numpy",)

    def __init__(self):
        super().__init__()
        self.imported = []
        self.kernels = {(pg.Op.MUL, "dense"): lambda a, b: _DeviceArray(a.array * b.array)}

    def from_numpy(self, array):
        return _DeviceArray(array)

    def to_numpy(self, array):
        return array.array

    def owns(self, array):
        return isinstance(array, _DeviceArray)

    def from_dlpack(self, obj):
        self.imported.append(obj)
        return _DeviceArray(obj.array)

    def memory_used(self, device=0):
        return 12345

    def memory_available(self, device=0):
        return 1 << 30


@pytest.fixture
def device_backend():
    be = DeviceBackend()
    plugin = types.SimpleNamespace(polygrad_backends=pg.hookimpl(lambda: [be]))
    pg.register_plugin(plugin, name="test-device-plugin")
    try:
        yield be
    finally:
        pg.unregister_plugin(plugin)


def test_from_dlpack_puts_device_data_on_the_backend_that_declares_the_device(device_backend):
    src = _OnFakeDevice(np.arange(6.0).reshape(2, 3))
    t = pg.from_dlpack(src)
    assert t.backend == "test-device" and device_backend.imported == [src]
    np.testing.assert_array_equal(t.numpy(), src.array)
    # to the host: read through the device's backend, then copied once
    h = pg.from_dlpack(src, backend="numpy")
    assert h.backend == "numpy" and isinstance(h.array, np.ndarray)
    np.testing.assert_array_equal(h.numpy(), src.array)
    # host data still goes to the default backend
    assert pg.from_dlpack(np.ones(3)).backend == pg.get_backend()


def test_device_data_without_a_backend_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match=f"device type {FAKE_DEVICE}.*dlpack_devices"):
        pg.from_dlpack(_OnFakeDevice(np.ones(2)))


def test_monitor_reports_the_memory_a_third_party_backend_reports(device_backend):
    x = pg.tensor(np.ones((2, 2)), backend="test-device")
    with pg.monitor() as m:
        np.testing.assert_array_equal((x * x).numpy(), np.ones((2, 2)))
        m.step()
    assert m.steps[0].gpu_bytes == 12345


def test_default_backend_is_the_highest_priority_and_names_no_backend_in_the_core():
    infos = [registry.get(i.name) for i in pg.list_backends() if i.available]
    best = max(infos, key=lambda b: (b.default_priority, [-ord(c) for c in b.name]))
    assert pg.get_backend() == best.name == "numpy"


def test_misspelled_hookimpl_is_reported_not_ignored():
    plugin = types.ModuleType("misspelled_plugin")

    @pg.hookimpl
    def polygrad_backend():  # missing the final "s"
        return []

    plugin.polygrad_backend = polygrad_backend
    pg.register_plugin(plugin, name="test-misspelled")
    try:
        info = {i.name: i for i in pg.list_backends()}["test-misspelled"]
        assert info.status == "failed" and "polygrad_backend" in info.reason
        assert not registry.pm.is_registered(plugin)
    finally:
        pg.unregister_plugin(plugin)
        registry.entries.pop("test-misspelled", None)


def test_only_marked_implementations_are_called():
    called = []
    plugin = types.ModuleType("unmarked_plugin")

    def polygrad_backends():  # no @pg.hookimpl: not an implementation
        called.append(True)
        return [DeviceBackend()]

    plugin.polygrad_backends = polygrad_backends
    pg.register_plugin(plugin, name="test-unmarked")
    try:
        assert called == []
        assert "test-device" not in {i.name for i in pg.list_backends()}
    finally:
        pg.unregister_plugin(plugin)


def test_kernel_lookup_is_public_and_returns_copies():
    k = pg.get_kernel("numpy", pg.Op.MATMUL)
    assert callable(k) and k is pg.get_kernel("numpy", "matmul", "dense")
    np.testing.assert_array_equal(k(np.eye(2), np.ones((2, 2))), np.ones((2, 2)))
    assert pg.get_kernel("numpy", pg.Op.MATMUL, "no-such-layout") is None
    table = pg.kernel_table("numpy")
    table.clear()  # a copy: dispatch is untouched
    assert pg.get_kernel("numpy", pg.Op.MATMUL) is k
    with pytest.raises(ValueError, match="kind"):
        pg.get_kernel("numpy", pg.Op.MATMUL, kind="backward")


def test_update_in_place_keeps_identity_and_checks_shape():
    w = pg.tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    grad = w.grad
    same = w.update_(w.array - 0.5 * grad.array)
    assert same is w and w.requires_grad and w.grad is grad and w.dtype == np.float32
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
    w.update_(np.array([3.0, 4.0]))      # float64 values: cast to the tensor's dtype
    assert w.dtype == np.float32 and w.numpy().tolist() == [3.0, 4.0]
    w.update_(pg.tensor([5.0, 6.0]))
    assert w.numpy().tolist() == [5.0, 6.0]
    with pytest.raises(ShapeError, match="update_"):
        w.update_(np.zeros(3))


def test_rng_is_public_and_seeded_by_manual_seed():
    pg.manual_seed(7)
    a = pg.rng().random(3)
    pg.manual_seed(7)
    assert np.array_equal(a, pg.rng().random(3))
    assert KDLCPU in registry.get("numpy").dlpack_devices
