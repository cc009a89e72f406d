#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Adds the Apache-2.0 SPDX line to every tracked source file that lacks it:
#   // SPDX-License-Identifier: Apache-2.0   (.h .cc .cu .cuh, version.h.in, attention_shapes.cc.in)
#   # SPDX-License-Identifier: Apache-2.0    (.py .pyi .sh, CMake files, Makefile, .ci/run)
# as the first line, or the second after a #! line. Idempotent: a file that has the line in its
# first two lines is left alone.
#   scripts/add_spdx.sh           add the line where it is missing, list the files changed
#   scripts/add_spdx.sh --check   change nothing; list the files without it, exit 1 if any
# Needs a git checkout (the file list is `git ls-files`); exits 77 (skip) outside one.
# The whole script is one function, parsed before it runs: it adds the line to itself too.
main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  check=0
  [[ "${1:-}" == --check ]] && check=1
  if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "add_spdx.sh: not a git checkout, nothing to do"
    exit 77
  fi
  tag="SPDX-License-Identifier: Apache-2.0"

  # The comment prefix of a tracked file, or nothing for files that take no header.
  prefix_of() {
    case $1 in
      tests/fuzz/corpus/* | tests/fuzz/regressions/*) ;;
      *.h | *.cc | *.cu | *.cuh | *.h.in | *.cc.in) echo "//" ;;
      *.py | *.pyi | *.sh | *.cmake | *.cmake.in | */CMakeLists.txt | CMakeLists.txt | Makefile | \
        .ci/run) echo "#" ;;
    esac
  }

  missing=0
  while IFS= read -r -d '' file; do
    prefix=$(prefix_of "$file")
    [[ -n "$prefix" && -f "$file" ]] || continue
    if head -n 2 "$file" | grep -qF "$tag"; then continue; fi
    missing=$((missing + 1))
    echo "$file"
    [[ $check == 1 ]] && continue
    line="$prefix $tag"
    tmp=$(mktemp)
    if head -n 1 "$file" | grep -q '^#!'; then
      { head -n 1 "$file"; echo "$line"; tail -n +2 "$file"; } >"$tmp"
    else
      { echo "$line"; cat "$file"; } >"$tmp"
    fi
    cat "$tmp" >"$file"  # keeps the file's mode (executable scripts stay executable)
    rm -f "$tmp"
  done < <(git ls-files -z)

  if [[ $check == 1 ]]; then
    if ((missing)); then
      echo "$missing tracked source files lack '$tag' (run scripts/add_spdx.sh)"
      exit 1
    fi
    echo "every tracked source file has '$tag'"
  else
    echo "added '$tag' to $missing files"
  fi
}

main "$@"; exit
