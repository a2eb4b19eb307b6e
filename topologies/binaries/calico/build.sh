#!/usr/bin/env bash
# Builds what drivers/calico-driver runs (Calico Felix in BPF mode, its BPF
# objects, Calico's CNI plugin and its CRDs) from a Calico source tree the user gives,
# once per version, into ${DPC_CACHE_DIR:-~/.cache/dpconform}/calico/<version>/.
#
#   build.sh CALICO_SRC     build (or find cached) the tree's version; prints its directory last
#
# Calico's releases are not on the Go module proxy (docs/calico.md), so the source is a
# path: a git checkout of github.com/projectcalico/calico at a tag or commit, or an
# unpacked tree with CALICO_VERSION set. The tree is never written to: it is copied
# into a build directory first (Calico's own build writes into felix/bpf-gpl).
#
# Environment:
#   CALICO_VERSION   the version to stamp and cache by; required unless CALICO_SRC is a
#                    git checkout (then `git describe --tags --dirty --always --abbrev=12`,
#                    as Calico's own Makefile stamps it)
#   LIBBPF_SRC       a git clone of github.com/libbpf/libbpf holding the tag the tree's
#                    metadata.mk names (LIBBPF_VERSION); without it the tree's own
#                    felix/bpf-gpl/libbpf is used, else it is cloned from GitHub as
#                    Calico's Makefile does
#   CALICO_PATCH     unified diffs (paths from the tree's root, applied with -p1, in
#                    order; colon-separated) to apply to the copy: changes the tree does
#                    not have, e.g. topologies/binaries/calico/patches/; the version gains
#                    "+<patch name>" for each and BUILDINFO names them with their SHA-256
#   DPC_CACHE_DIR    the cache root (default ${XDG_CACHE_HOME:-~/.cache}/dpconform)
#
# Debian packages it needs (clang-19, llvm-19, libpcap-dev, libelf-dev, zlib1g-dev,
# make, gcc, git, patch) are installed when missing.
set -euo pipefail

die() { echo "calico: $*" >&2; exit 1; }

src=${1:-}
[ -n "$src" ] || die "no source tree: run \`make calico CALICO_SRC=/path/to/calico\` (a checkout of github.com/projectcalico/calico, e.g. at tag v3.31.6)"
[ -d "$src" ] || die "CALICO_SRC=$src is not a directory"
src=$(cd "$src" && pwd)
for f in metadata.mk go.mod felix/cmd/calico-felix felix/bpf-gpl/Makefile cni-plugin/cmd/calico libcalico-go/config/crd; do
	[ -e "$src/$f" ] || die "CALICO_SRC=$src has no $f: it is not a Calico source tree (github.com/projectcalico/calico, v3.29 or later)"
done

# The toolchain Calico's build image has, from Debian: clang/llc 19 for the BPF
# programs (the image has LLVM 18), libpcap for Felix's cgo, libelf and zlib for libbpf.
pkgs="clang-19 llvm-19 libpcap-dev libelf-dev zlib1g-dev make gcc git patch"
missing=$(for p in $pkgs; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
	echo "calico: installing $(echo $missing)"
	# Another build on the machine may hold the dpkg lock: wait for it rather than fail.
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $missing >/dev/null
fi

# The version and commit the binaries are stamped with and cached by.
commit=unknown
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
	commit=$(git -C "$src" rev-parse HEAD)
	version=${CALICO_VERSION:-$(git -C "$src" describe --tags --dirty --always --abbrev=12)}
	dirty=$(git -C "$src" status --porcelain --untracked-files=no | head -1)
else
	version=${CALICO_VERSION:-}
	[ -n "$version" ] || die "CALICO_SRC=$src is not a git checkout: set CALICO_VERSION to the version it holds"
	dirty=""
fi
case "$version" in
*/* | .* | "") die "version \"$version\" cannot name a directory: set CALICO_VERSION" ;;
esac
# The patches, in order: absolute paths, and what BUILDINFO says of them.
patches=()
patch_name=""
if [ -n "${CALICO_PATCH:-}" ]; then
	IFS=: read -r -a given <<<"$CALICO_PATCH"
	for p in "${given[@]}"; do
		[ -f "$p" ] || die "CALICO_PATCH: $p is not a file"
		p=$(cd "$(dirname "$p")" && pwd)/$(basename "$p")
		patches+=("$p")
		name=$(basename "$p" .patch)
		version="$version+$name"
		patch_name="${patch_name:+$patch_name, }$name (sha256 $(sha256sum "$p" | cut -d' ' -f1))"
	done
fi
libbpf_version=$(sed -n 's/^LIBBPF_VERSION=//p' "$src/metadata.mk")
[ -n "$libbpf_version" ] || die "$src/metadata.mk names no LIBBPF_VERSION"

root=${DPC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpconform}
out="$root/calico/$version"
mkdir -p "$root/calico"
# One build of a version at a time on the machine; the second finds the first's result.
exec 9>"$root/calico/.lock-$version"
flock 9
if [ -f "$out/BUILDINFO" ]; then
	echo "calico $version: cached at $out"
	echo "$out"
	exit 0
fi

start=$SECONDS
build=$(mktemp -d "$root/calico/.build-$version.XXXXXX")
trap 'rm -rf "$build"' EXIT
# A signal ends the script through its EXIT trap, so an interrupted build leaves nothing.
trap 'exit 1' INT TERM HUP
tree="$build/src"
stage="$build/out"
mkdir -p "$tree" "$stage/bin" "$stage/cni" "$stage/bpf" "$stage/crds"
echo "calico $version (commit $commit${dirty:+, with uncommitted changes}) from $src -> $out"
tar -C "$src" --exclude=./.git -cf - . | tar -C "$tree" -xf -
for p in "${patches[@]}"; do
	patch -p1 -s --forward --no-backup-if-mismatch -d "$tree" <"$p" ||
		die "CALICO_PATCH: $p does not apply to $src (commit $commit), or not after the patches before it"
	echo "  patched: $(basename "$p" .patch)"
done

# libbpf, at the version the tree names, where Felix's cgo and the BPF programs find it.
lb="$tree/felix/bpf-gpl/libbpf"
if [ -d "$lb/src" ]; then
	echo "  libbpf: the tree's own felix/bpf-gpl/libbpf"
elif [ -n "${LIBBPF_SRC:-}" ]; then
	git -C "$LIBBPF_SRC" rev-parse --verify -q "$libbpf_version^{commit}" >/dev/null ||
		die "LIBBPF_SRC=$LIBBPF_SRC has no tag $libbpf_version (the version $src/metadata.mk names): give a git clone of github.com/libbpf/libbpf that holds it"
	mkdir -p "$lb"
	git -C "$LIBBPF_SRC" archive "$libbpf_version" | tar -C "$lb" -xf -
	echo "  libbpf: $libbpf_version from $LIBBPF_SRC"
else
	git clone -q --depth 1 --branch "$libbpf_version" https://github.com/libbpf/libbpf.git "$lb" ||
		die "cannot clone libbpf $libbpf_version from GitHub: set LIBBPF_SRC to a git clone of github.com/libbpf/libbpf holding tag $libbpf_version"
	echo "  libbpf: $libbpf_version cloned from GitHub"
fi
t=$SECONDS
mkdir -p "$lb/src/amd64"
make -s -j"$(nproc)" -C "$lb/src" BUILD_STATIC_ONLY=1 OBJDIR=amd64 >/dev/null
echo "  libbpf: built in $((SECONDS - t)) s"

cd "$tree"
export GOFLAGS=-mod=mod CGO_ENABLED=1
pkgs_go="./felix/cmd/calico-felix ./cni-plugin/cmd/calico"

# A module proxy may refuse some of the exact dependency versions the release pins
# (this project's development machine's refuses k8s.io/kubernetes v1.33.10 and several
# k8s.io/* v0.33.x). Each refused one is replaced by the nearest version it serves,
# the next lower patch first, and listed in BUILDINFO: the binaries are then not
# exactly the release's, and the report says so.
pins=""
served() { go mod download -json "$1@$2" 2>/dev/null | grep -q '"GoMod"'; }
nearest() {
	local mod=$1 want=$2 base patch p
	base=${want%.*}
	patch=${want##*.}
	case "$patch" in *[!0-9]* | "") return 1 ;; esac
	for ((p = patch - 1; p >= 0; p--)); do served "$mod" "$base.$p" && { echo "$base.$p"; return 0; }; done
	for ((p = patch + 1; p <= patch + 5; p++)); do served "$mod" "$base.$p" && { echo "$base.$p"; return 0; }; done
	return 1
}
for attempt in $(seq 1 60); do
	if err=$(go list -deps $pkgs_go 2>&1 >/dev/null); then
		break
	fi
	ref=$(grep -oE '[a-zA-Z0-9./_-]+@v[0-9][^: ]*: (reading|verifying) [^ ]*: (403|404|410)' <<<"$err" | head -1 || true)
	[ -n "$ref" ] || { echo "$err" >&2; die "resolving the dependencies of $pkgs_go failed (above)"; }
	mod=${ref%%@*}
	want=${ref#*@}
	want=${want%%:*}
	new=$(nearest "$mod" "$want") || die "the module proxy ($(go env GOPROXY)) serves neither $mod@$want nor a nearby patch of it"
	echo "  pinned $mod $want -> $new (the proxy refuses $want)"
	go mod edit -replace="$mod=$mod@$new"
	pins="$pins$mod $want -> $new"$'\n'
	[ "$attempt" -lt 60 ] || die "more than 60 dependencies refused"
done

t=$SECONDS
# The programs include <linux/bpf.h>, whose <asm/types.h> Debian keeps under the
# multiarch directory (/usr/include/x86_64-linux-gnu), which clang does not search for
# the bpf target; Calico's build image has it in /usr/include. Searched last, so the
# tree's own headers (libbpf's) win.
bpfcc="clang-19 -idirafter /usr/include/$(gcc -dumpmachine)"
link=()
# A tree whose build image has a newer LLVM than 19 (metadata.mk's LLVM_VERSION; v3.33
# on: 21) is written for it: LLVM 20 made BPF CPU v3 the default (its 32-bit atomics,
# which v3.33's conntrack cleanup uses), and its Makefile links with
# -bpf-disable-trap-unreachable, which undoes a trap LLVM 21 adds after every
# __builtin_unreachable() and which llc-19, adding none, does not know. Build it as that
# LLVM would: CPU v3, and no flag for a trap that is not there.
tree_llvm=$(sed -n 's/^LLVM_VERSION=//p' metadata.mk)
if [ "${tree_llvm%%.*}" -gt 19 ] 2>/dev/null; then
	bpfcc="$bpfcc -mcpu=v3"
	link=('LINK=$(LD) -march=$(BPF_TARGET) -mcpu=v3 -filetype=obj -o $@ $<')
	echo "  BPF objects: for LLVM $tree_llvm with llc-19: CPU v3, linked without -bpf-disable-trap-unreachable"
fi
# bpf-gpl's calculate-flags prints a line per object: only errors are worth showing.
make -s -j"$(nproc)" -C felix/bpf-apache CC="$bpfcc" LD=llc-19 all 2>&1 | { grep -v '^Flags: \|cannot access .\*\.d.' || :; }
make -s -j"$(nproc)" -C felix/bpf-gpl CC="$bpfcc" LD=llc-19 "${link[@]}" all 2>&1 | { grep -v '^Flags: \|cannot access .\*\.d.' || :; }
cp felix/bpf-apache/bin/*.o felix/bpf-gpl/bin/*.o "$stage/bpf/"
echo "  BPF objects: $(ls "$stage/bpf" | wc -l) built in $((SECONDS - t)) s"

# Stamped as Calico's lib.Makefile stamps its binaries.
ldflags="-X github.com/projectcalico/calico/pkg/buildinfo.Version=$version
 -X github.com/projectcalico/calico/pkg/buildinfo.GitRevision=$commit
 -X github.com/projectcalico/calico/pkg/buildinfo.BuildDate=$(date -u +%FT%TZ)"
t=$SECONDS
go build -buildvcs=false -ldflags "$(echo $ldflags)" -o "$stage/bin/calico-felix" ./felix/cmd/calico-felix
echo "  calico-felix: built in $((SECONDS - t)) s"
t=$SECONDS
go build -buildvcs=false -ldflags "$(echo $ldflags)" -o "$stage/cni/calico" ./cni-plugin/cmd/calico
echo "  calico (CNI plugin): built in $((SECONDS - t)) s"
# Calico's BPF debugging tool: the driver's diagnostics dump Felix's maps with it.
t=$SECONDS
go build -buildvcs=false -ldflags "$(echo $ldflags)" -o "$stage/bin/calico-bpf" ./felix/cmd/calico-bpf
echo "  calico-bpf: built in $((SECONDS - t)) s"
cp libcalico-go/config/crd/*.yaml "$stage/crds/"

# What the build was, as YAML (the driver reads it; docs/calico.md).
q() { printf "'%s'" "${1//\'/\'\'}"; }
{
	echo "version: $(q "$version")"
	echo "commit: $(q "$commit")"
	echo "dirty: $([ -n "$dirty" ] && echo true || echo false)"
	[ -z "$patch_name" ] || echo "patch: $(q "$patch_name")"
	echo "libbpf: $(q "$libbpf_version")"
	echo "go: $(q "$(go env GOVERSION)")"
	echo "clang: $(q "$(clang-19 --version | head -1)")"
	echo "built: $(q "$(date -u +%FT%TZ)")"
	if [ -z "$pins" ]; then
		echo "pinned: []"
	else
		echo "pinned:"
		while IFS= read -r p; do [ -n "$p" ] && echo "  - $(q "$p")"; done <<<"$pins"
	fi
} >"$stage/BUILDINFO.tmp"
# BUILDINFO is written last: a directory with it is a complete build.
rm -rf "$out"
mv "$stage" "$out"
mv "$out/BUILDINFO.tmp" "$out/BUILDINFO"
echo "calico $version: built in $((SECONDS - start)) s"
echo "$out"
