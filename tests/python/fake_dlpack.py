# SPDX-License-Identifier: Apache-2.0
"""DLPack producers that claim CUDA (or impossible host) memory, for testing the binding's device
handling on a machine without a GPU. Their data pointer is fake: use them only where the binding
must reject the call before any of that memory is touched."""

import ctypes

KDL_CPU = 1
KDL_CUDA = 2
# DLPack codes: 0 signed int, 1 unsigned int, 2 float, 4 bfloat.
_DTYPES = {"int32": (0, 32), "int64": (0, 64), "uint8": (1, 8), "uint16": (1, 16),
           "float32": (2, 32), "bfloat16": (4, 16)}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeCudaArray:
    device_type = KDL_CUDA

    def __init__(self, shape, dtype="int32", device_id=0, strides=None):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        if strides is None:  # C-contiguous, each wrapped into int64 as a C producer's would be
            strides, step = [], 1
            for n in reversed(shape):
                strides.insert(0, (step + 2**63) % 2**64 - 2**63)
                step *= n
        self._strides = (ctypes.c_int64 * len(shape))(*strides)
        self.device_id = device_id
        code, bits = _DTYPES[dtype]
        self._tensors = []  # every capsule's struct stays alive with this object
        self._dtype = _DLDataType(code, bits, 1)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        if max_version is not None:
            raise TypeError("only unversioned capsules")
        t = _DLManagedTensor()
        t.dl_tensor.data = 0x10000  # never dereferenced by the tests that use this class
        t.dl_tensor.device = _DLDevice(self.device_type, self.device_id)
        t.dl_tensor.ndim = len(self._shape)
        t.dl_tensor.dtype = self._dtype
        t.dl_tensor.shape = self._shape
        t.dl_tensor.strides = self._strides
        t.dl_tensor.byte_offset = 0
        t.manager_ctx = None
        t.deleter = None
        self._tensors.append(t)
        return _capsule_new(ctypes.addressof(t), b"dltensor", None)


class FakeHostArray(FakeCudaArray):
    """The same fake claiming host memory: only for calls that must fail before reading it (a
    shape whose element count or bytes overflow int64)."""

    device_type = KDL_CPU


def fake_cuda_batch(num_reqs=2, num_tokens=2, max_blocks=4, device_id=0):
    return (
        FakeCudaArray([num_reqs + 1], device_id=device_id),
        FakeCudaArray([num_reqs], device_id=device_id),
        FakeCudaArray([num_reqs, max_blocks], device_id=device_id),
        FakeCudaArray([num_tokens], "int64", device_id=device_id),
    )
