# SPDX-License-Identifier: Apache-2.0
"""examples/engine_step.py needs torch and a CUDA GPU; without them it must stop with a clear
message and exit status 2 (it is run for real on the GPU machine)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engine_step.py"


def gpu_stack_present():
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


@pytest.mark.skipif(gpu_stack_present(), reason="torch with a GPU is here: the example runs")
def test_example_explains_what_is_missing():
    run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "1"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("engine_step.py: needs ")
    assert "torch" in run.stderr or "CUDA GPU" in run.stderr


def test_example_help_runs_without_gpu():
    run = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "--anchors" in run.stdout


QUICKSTART = EXAMPLE.parent / "python_quickstart.py"


def test_gpu_free_quickstart_runs():
    run = subprocess.run([sys.executable, str(QUICKSTART)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert "matches numpy" in run.stdout
    assert "ragged indptr [0, 5, 13]" in run.stdout
