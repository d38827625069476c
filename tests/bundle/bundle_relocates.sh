#!/usr/bin/env bash
# bundle_relocates.sh SOURCE_DIR BUILD_DIR: the relocatable bundle (issue 29) packed from this build
# by bench/gpu/bundle.sh, unpacked into a fresh folder elsewhere, runs there through its launcher:
# memwall --version and a short memwall run; every shared library the run loads comes from the
# bundle, but glibc, the NVIDIA driver and the CUDA runtime libraries (what the target brings);
# README.md states the bundle's minimum glibc as its MANIFEST does.
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$src/bench/gpu/bundle.sh" "$build" "$tmp/memwall.tar.gz" > "$tmp/bundle.log" 2>&1 || { cat "$tmp/bundle.log"; exit 1; }
mkdir -p "$tmp/elsewhere/fresh"
tar -xzf "$tmp/memwall.tar.gz" -C "$tmp/elsewhere/fresh"
root=$(echo "$tmp"/elsewhere/fresh/memwall-*)
cd "$tmp/elsewhere"  # not the source or build folder

# the version, then the backends and (with the cuda backend) the devices and cuBLAS, as found from the bundle
version=$("$root/bin/memwall" --version)
[[ "$(head -n 1 <<< "$version")" =~ ^memwall\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "memwall --version printed: $version"; exit 1; }
[[ "$(sed -n 2p <<< "$version")" =~ ^backends:\ cpu ]] || { echo "memwall --version printed: $version"; exit 1; }
"$root/bin/memwall" run --config "$root/share/memwall/short.yaml" --steps 3 > "$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log"; echo "bundle_relocates.sh: the short run failed"; exit 1; }
grep -Eq '^loss [0-9.]+ -> [0-9.]+ over 3 steps' "$tmp/run.log" || { cat "$tmp/run.log"; exit 1; }

# The libraries the program loads, as the loader reports them, with the launcher's library path.
eval "$("$root/bin/launch" --env)"
LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld" "$root/libexec/memwall/memwall" run --config "$root/share/memwall/short.yaml" \
  --steps 1 > /dev/null 2>&1
loaded=$(cat "$tmp"/ld.* | sed -n 's/.*calling init: //p' | sort -u)
[ -n "$loaded" ] || { echo "bundle_relocates.sh: LD_DEBUG reported no library"; exit 1; }
target='/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so[.0-9]*$'
bad=$(grep -v "^$root/lib/" <<< "$loaded" | grep -Ev "$target" || true)
if [ -n "$bad" ]; then
  echo "bundle_relocates.sh: loaded from outside the bundle (and not glibc, the driver or CUDA):"
  echo "$bad"
  exit 1
fi
from_bundle=$(grep -c "^$root/lib/" <<< "$loaded")

glibc=$(sed -n 's/^minimum glibc: //p' "$root/MANIFEST")
grep -q "glibc $glibc" "$src/README.md" ||
  { echo "bundle_relocates.sh: README.md does not say the bundle needs glibc $glibc (MANIFEST)"; exit 1; }
echo "bundle_relocates.sh: $(du -h "$tmp/memwall.tar.gz" | cut -f1) bundle ran from $root: $version;" \
     "$from_bundle libraries from the bundle, the rest glibc and CUDA; minimum glibc $glibc"
