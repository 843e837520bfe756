#!/usr/bin/env bash
# Installs what `--features exact` of crates/sim needs to build HiGHS from source (through
# good_lp's `highs` feature): cmake and a C++ compiler for the solver, libclang for the
# bindings' generation (bindgen). Debian packages; skips what is already there.
# Needs root (or sudo) and apt-get.
set -euo pipefail

have_libclang() {
  [[ -n ${LIBCLANG_PATH:-} && -e ${LIBCLANG_PATH} ]] && return 0
  ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so\b' && return 0
  compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null && return 0
  return 1
}

missing=()
have_libclang || missing+=(libclang-dev)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v c++ >/dev/null 2>&1 || missing+=(g++)

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "exact-deps: libclang, cmake and a C++ compiler found"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -E bash "$0" "$@"
  fi
  echo "exact-deps.sh: needs root to install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "exact-deps.sh: no apt-get; install ${missing[*]} yourself" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "exact-deps: installing ${missing[*]}"
if ! apt-get install -y --no-install-recommends "${missing[@]}"; then
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
have_libclang || { echo "exact-deps.sh: libclang still not found" >&2; exit 1; }
echo "exact-deps: installed ${missing[*]}"
