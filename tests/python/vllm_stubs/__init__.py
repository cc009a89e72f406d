# SPDX-License-Identifier: Apache-2.0
"""Support for the vLLM drop-in's tests: a fresh import of the drop-in (bound to whatever vLLM
sys.modules holds now) and, in fake_vllm, a stand-in of vLLM 0.33's class structure."""

import contextlib
import importlib
import os
import subprocess
import sys

DROPIN = "sparse_swa.integrations.vllm"


def fresh_dropin():
    """sparse_swa.integrations.vllm imported anew: its builders derive from the vLLM found now
    (the modules imported before keep the vLLM they found)."""
    for name in [m for m in sys.modules if m == DROPIN or m.startswith(DROPIN + ".")]:
        del sys.modules[name]
    return importlib.import_module(DROPIN)


@contextlib.contextmanager
def installed_on(load, unload, on_gpu):
    """(the modules load() gives, the drop-in bound to them, install()'s Installation); vLLM's
    kernels run in Triton's interpreter off the GPU. Afterwards uninstall(), unload(), the
    environment as it was and the drop-in bound to no vLLM again."""
    env = os.environ.get("TRITON_INTERPRET")
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    dropin = None
    try:
        loaded = load()
        dropin = fresh_dropin()
        yield loaded, dropin, dropin.install(sys.modules["vllm"])
    finally:
        if dropin is not None:
            dropin.uninstall()
        unload()
        if env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env
        fresh_dropin()


def run_in_fresh_interpreter(test_file, *pytest_args):
    """The test file in a new Python with TRITON_INTERPRET=1 (Triton reads it at import); the
    stdout tail for -s, an AssertionError with the output on a failure."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *pytest_args, "-p",
                             "no:cacheprovider", test_file], env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return result.stdout[-3000:]
