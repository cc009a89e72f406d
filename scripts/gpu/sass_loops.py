#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per kernel of a CUDA object or binary: registers and stack, then each loop of the SASS (a
backward branch over at least --min instructions) with its instruction count and the
instructions that a change to a hot loop most often adds unseen: local-memory spills and reloads
(STL, LDL), special-register reads (S2R), beside its wgmma (HGMMA) and mbarrier (SYNCS) counts
and the uniform registers it names (UR).
Run it on the build of a kernel variant before timing it (docs/notes/attention-retrospective.md,
"Read the SASS before timing a variant": a build whose fp8_ds_mla producer loop gained a spill and
S2R reads and went from 18 uniform registers to 5 measured 6-30 % slower).

    scripts/gpu/sass_loops.py build-gpu/CMakeFiles/sparse_swa.dir/src/cuda/FILE.cu.o \\
        [--kernel REGEX] [--min 200]

Needs cuobjdump: on PATH, in /usr/local/cuda/bin, $CUOBJDUMP, or from PyPI
(pip install nvidia-cuda-cuobjdump), which this script finds in the Python environment.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def find_cuobjdump():
    for path in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                 "/usr/local/cuda/bin/cuobjdump"):
        if path and os.access(path, os.X_OK):
            return path
    try:
        import nvidia  # the PyPI wheels' namespace package
        for root in nvidia.__path__:
            for path in glob.glob(os.path.join(root, "cu*", "bin", "cuobjdump")):
                if os.access(path, os.X_OK):
                    return path
    except ImportError:
        pass
    return None


# One SASS line: /*0a30*/  OPCODE operands ;
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def lines_by_kernel(text, heading):
    """(kernel, line) for each line of cuobjdump output under a `heading` line naming a kernel."""
    name = None
    for line in text.splitlines():
        m = re.search(heading, line)
        if m:
            name = m.group(1)
        elif name:
            yield name, line


def parse_sass(text):
    """{kernel: [(address, instruction text)]} from cuobjdump -sass."""
    kernels = {}
    for name, line in lines_by_kernel(text, r"Function : (\S+)"):
        m = INSTRUCTION.match(line)
        if m:
            kernels.setdefault(name, []).append((int(m.group(1), 16), m.group(2)))
    return kernels


def parse_resources(text):
    """{kernel: 'REG:n STACK:n'} from cuobjdump -res-usage."""
    out = {}
    for name, line in lines_by_kernel(text, r"Function (\S+):"):
        m = re.search(r"(REG:\d+) (STACK:\d+)", line)
        if m:
            out[name] = m.group(1) + " " + m.group(2)
    return out


COUNTED = [("STL", r"\bSTL"), ("LDL", r"\bLDL"), ("S2R", r"\bS2R\b"), ("HGMMA", r"\bHGMMA"),
           ("SYNCS", r"\bSYNCS")]


def counts(instructions):
    """The COUNTED instructions, and how many distinct uniform registers the code names (values
    that ptxas proved warp-uniform live there, not in the threads' registers)."""
    found = " ".join(f"{label} {sum(1 for _, t in instructions if re.search(pattern, t))}"
                     for label, pattern in COUNTED)
    uniform = {r for _, t in instructions for r in re.findall(r"\bUR\d+\b", t)}
    return f"{found} UR {len(uniform)}"


def loops(instructions, min_count):
    """(start, end, body) of each backward branch over at least min_count instructions. The
    branches past the last EXIT are left out: they end ptxas's out-of-line stubs (an mbarrier
    wait's retry), which jump back into the code they were taken from."""
    exits = [a for a, t in instructions if re.search(r"\bEXIT\b", t)]
    last_exit = exits[-1] if exits else instructions[-1][0]
    found = set()
    for address, text in instructions:
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < address <= last_exit:
            found.add((int(m.group(1), 16), address))
    result = []
    for start, end in sorted(found):
        body = [(a, t) for a, t in instructions if start <= a <= end]
        if len(body) >= min_count:
            result.append((start, end, body))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("file", help="a CUDA object file or binary with sm_90a SASS")
    parser.add_argument("--kernel", default="",
                        help="only kernels whose mangled name matches this regex")
    parser.add_argument("--min", type=int, default=200, help="smallest loop shown, in instructions")
    args = parser.parse_args()
    tool = find_cuobjdump()
    if tool is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump (or set CUOBJDUMP)",
              file=sys.stderr)
        return 2
    sass = subprocess.run([tool, "-sass", args.file], capture_output=True, text=True)
    if sass.returncode != 0:
        print(sass.stderr.strip(), file=sys.stderr)
        return 1
    usage = subprocess.run([tool, "-res-usage", args.file], capture_output=True, text=True)
    resources = parse_resources(usage.stdout)
    for name, instructions in parse_sass(sass.stdout).items():
        if not instructions or not re.search(args.kernel, name):
            continue
        print(f"{name}\n  {resources.get(name, '')}  {len(instructions)} instructions, "
              f"{counts(instructions)}")
        for start, end, body in loops(instructions, args.min):
            print(f"  loop {start:#x}-{end:#x}: {len(body)} instructions, {counts(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
