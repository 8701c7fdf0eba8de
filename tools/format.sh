#!/usr/bin/env bash
# Formats (or with --check, verifies) every C++ file with the repo's .clang-format (Google style).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc')
if [[ "${1:-}" == "--check" ]]; then
  clang-format --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files clean"
else
  clang-format -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
fi
