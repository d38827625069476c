#!/usr/bin/env bash
# bench/gpu/bundle.sh [BUILD_DIR [OUT.tar.gz]]: packs a build into one relocatable tarball for a
# machine that has an NVIDIA driver and the CUDA runtime libraries but none of memwall's build
# dependencies (a cluster node, the lent GPU machine): `cmake --install` into a staging prefix,
# then every shared library the programs load, except the C library (glibc), the NVIDIA driver
# (libcuda) and the CUDA runtime libraries (cudart, cuBLAS, cuBLASLt, NCCL), copied into lib/.
# bin/launch sets the library path to the bundle's lib/ plus the CUDA libraries it finds on the
# target (bin/launch --where says where) and runs a bundled program; bin/memwall is `launch memwall`.
# The minimum glibc of the target is the highest GLIBC_ symbol version any bundled file needs; it
# is written to MANIFEST. No path of the build machine goes into the bundle (checked at the end).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
version=$(sed -n 's/^project(memwall VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
name="memwall-$version-$(uname -m)"
out=${2:-$build/$name.tar.gz}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

[ -f "$build/CMakeCache.txt" ] || { echo "bundle.sh: $build: not a configured build folder" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
cmake --install "$build" --prefix "$root" --component device > /dev/null

# Libraries the target brings itself: glibc (whose version it must meet), the driver, the CUDA runtime.
from_target='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|ld-linux-aarch64|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]*)\.so'
mkdir -p "$root/lib"
programs=$(find "$root/libexec" -type f -perm -u+x)
# ldd resolves the whole tree of each program (the libraries' own needs too), as the loader will.
for p in $programs; do
  LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64" ldd "$p" | while read -r lib _ path _; do
    case "$path" in /*) ;; *) continue ;; esac
    if [[ "$lib" =~ $from_target ]]; then continue; fi
    [ -e "$root/lib/$lib" ] || cp -L "$path" "$root/lib/$lib"
  done
  if LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64" ldd "$p" | grep -q 'not found'; then
    echo "bundle.sh: $p needs a library this machine does not have:" >&2
    ldd "$p" | grep 'not found' >&2
    exit 1
  fi
done
# Smaller and without the build machine's paths: debug sections (and their source paths) removed.
strip --strip-debug "$root"/libexec/memwall/* "$root"/lib/*.so* 2>/dev/null || true
chmod u+w "$root"/lib/*

glibc=$(for f in "$root"/libexec/memwall/* "$root"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1)
{
  echo "memwall $version ($(uname -m)), built $(date -u +%Y-%m-%d) from $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo 'an unknown commit')"
  echo "minimum glibc: $glibc"
  echo "from the target: glibc, the NVIDIA driver (libcuda.so.1), the CUDA runtime libraries (libcudart, libcublas, libcublasLt, libnccl)"
  echo "bundled libraries:"
  (cd "$root/lib" && ls -1 | sed 's/^/  /')
} > "$root/MANIFEST"

# Nothing of the build machine: no absolute path of the source or build folder in any file.
if grep -rlaF -e "$src/" -e "$build/" "$root" > "$stage/leaks"; then
  echo "bundle.sh: these files still name the build machine's folders ($src, $build):" >&2
  sed "s|$stage/||" "$stage/leaks" >&2
  exit 1
fi

tar -C "$stage" -czf "$out" "$name"
echo "bundle.sh: $out ($(du -h "$out" | cut -f1)), minimum glibc $glibc"
