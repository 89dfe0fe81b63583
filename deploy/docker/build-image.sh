#!/usr/bin/env bash
# Builds the Shoal runtime image from local files only (no registry is contacted).
#
#   deploy/docker/build-image.sh [--release|--debug] [--bin-dir DIR] [--tag TAG]
#
# --release (default) runs `cargo build --release` and takes target/release; --debug runs
# `cargo build` and takes target/debug; --bin-dir DIR takes the binaries from DIR and runs no
# cargo (the tests pass the binaries cargo built for them). The tag defaults to shoal:latest,
# the image compose.yaml runs unless SHOAL_IMAGE says otherwise.
#
# The image is FROM scratch: the binaries plus every shared library `ldd` lists for them (and
# the dynamic loader), copied to the same paths, so the image runs exactly the libraries the
# binaries were linked and tested against. See README.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=release
bin_dir=
tag=shoal:latest
while [ $# -gt 0 ]; do
    case "$1" in
        --release) mode=release ;;
        --debug) mode=debug ;;
        --bin-dir) bin_dir=$2; shift ;;
        --tag) tag=$2; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

bins="shoal shoal-mgmd shoal-datanode shoal-sqlnode"
if [ -z "$bin_dir" ]; then
    target=${CARGO_TARGET_DIR:-$repo/target}
    if [ "$mode" = release ]; then
        (cd "$repo" && cargo build --release --bins)
        bin_dir=$target/release
    else
        (cd "$repo" && cargo build --bins)
        bin_dir=$target/debug
    fi
fi
for b in $bins; do
    [ -x "$bin_dir/$b" ] || { echo "build-image.sh: no executable $bin_dir/$b" >&2; exit 1; }
done

ctx=$(mktemp -d "${TMPDIR:-/tmp}/shoal-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc" "$ctx/data"
mkdir -m 1777 "$root/tmp"

# Binaries, and every library they load: `ldd` prints "name => /path (addr)" for libraries and
# "/path (addr)" for the loader. Copy the files (not symlinks) to the paths ldd printed; the
# loader's own path is the one baked into the binaries (PT_INTERP), and the libraries' paths are
# in its default search path.
libs=()
for b in $bins; do
    cp "$bin_dir/$b" "$root/usr/local/bin/$b"
    if ! out=$(ldd "$bin_dir/$b" 2>&1); then
        case "$out" in
            *"not a dynamic executable"*|*"statically linked"*) continue ;;
            *) echo "build-image.sh: ldd $b: $out" >&2; exit 1 ;;
        esac
    fi
    if grep -q "not found" <<<"$out"; then
        echo "build-image.sh: $b needs a library this machine lacks:" >&2
        grep "not found" <<<"$out" >&2
        exit 1
    fi
    while read -r lib; do libs+=("$lib"); done < <(awk '
        $2 == "=>" && $3 ~ /^\// { print $3 }
        $1 ~ /^\// { print $1 }' <<<"$out")
done
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done

# Name resolution: glibc reads nsswitch.conf; docker provides /etc/hosts and /etc/resolv.conf.
# The files and dns NSS modules are part of libc.so.6 since glibc 2.34, so no libnss_* copies.
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
printf 'root:x:0:0:root:/:/nonexistent\nshoal:x:10001:10001:shoal:/var/lib/shoal:/nonexistent\n' >"$root/etc/passwd"
printf 'root:x:0:\nshoal:x:10001:\n' >"$root/etc/group"

cp "$here/Dockerfile" "$ctx/Dockerfile"
echo "== image $tag from $bin_dir ($(du -sh "$root" | cut -f1) of files)"
docker build --quiet -t "$tag" "$ctx"
