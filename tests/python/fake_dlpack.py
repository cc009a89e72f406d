"""A DLPack producer that claims CUDA memory, for testing the binding's device handling on a
machine without a GPU. Its data pointer is fake: use it only where the binding must reject the
call before any device memory is touched."""

import ctypes

KDL_CUDA = 2
_DTYPES = {"int32": (0, 32), "int64": (0, 64)}  # DLPack code 0 = signed int


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
    def __init__(self, shape, dtype="int32", device_id=0):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
        self._strides = (ctypes.c_int64 * len(shape))(*strides)
        self.device_id = device_id
        code, bits = _DTYPES[dtype]
        self._tensors = []  # every capsule's struct stays alive with this object
        self._dtype = _DLDataType(code, bits, 1)

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        if max_version is not None:
            raise TypeError("only unversioned capsules")
        t = _DLManagedTensor()
        t.dl_tensor.data = 0x10000  # never dereferenced by the tests that use this class
        t.dl_tensor.device = _DLDevice(KDL_CUDA, self.device_id)
        t.dl_tensor.ndim = len(self._shape)
        t.dl_tensor.dtype = self._dtype
        t.dl_tensor.shape = self._shape
        t.dl_tensor.strides = self._strides
        t.dl_tensor.byte_offset = 0
        t.manager_ctx = None
        t.deleter = None
        self._tensors.append(t)
        return _capsule_new(ctypes.addressof(t), b"dltensor", None)


def fake_cuda_batch(num_reqs=2, num_tokens=2, max_blocks=4, device_id=0):
    return (
        FakeCudaArray([num_reqs + 1], device_id=device_id),
        FakeCudaArray([num_reqs], device_id=device_id),
        FakeCudaArray([num_reqs, max_blocks], device_id=device_id),
        FakeCudaArray([num_tokens], "int64", device_id=device_id),
    )
