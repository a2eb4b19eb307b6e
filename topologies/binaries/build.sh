#!/usr/bin/env bash
# Builds the third-party binaries a netns topology runs, once, into a per-user cache
# keyed by their versions, so that every clone on this machine reuses them.
#
#   build.sh control-plane   etcd, kube-apiserver, kube-controller-manager, kube-proxy
#   build.sh cni             ptp, host-local, loopback
#   build.sh kube-router     kube-router (a NetworkPolicy peer; its own module, kube-router/)
#   build.sh kind-node       kubelet, kubeadm, kubectl, kube-scheduler (for the kind node
#                            image, beside the control plane: same version, same directory)
#   build.sh dir             print the cache directory (builds nothing)
#
# DPC_CACHE_DIR overrides the cache root (default ${XDG_CACHE_HOME:-~/.cache}/dpconform).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

ver() { go list -m -f '{{.Version}}' "$1"; }
k8s=$(ver k8s.io/kubernetes)
etcd=$(ver go.etcd.io/etcd/server/v3)
cni=$(ver github.com/containernetworking/plugins)
root=${DPC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpconform}
cpdir="$root/control-plane/k8s-$k8s-etcd-$etcd"
cnidir="$root/cni/plugins-$cni"
# kube-router is built from a module of its own (kube-router/go.mod says why).
kr=$(cd kube-router && ver github.com/cloudnativelabs/kube-router/v2)
krdir="$root/kube-router/$kr"

# progress NAME START: reads `go build -v` output, prints a line every 100 packages
# and every line that is not a package path (compiler errors, "# pkg" headers).
progress() {
	local n=0 line
	while IFS= read -r line; do
		case "$line" in
		"#"* | *" "* | *:*) echo "$line" ;;
		*)
			n=$((n + 1))
			if [ $((n % 100)) -eq 0 ]; then
				echo "    $1: $n packages compiled, $((SECONDS - $2)) s"
			fi
			;;
		esac
	done
}

# build NAME PKG DIR [LDFLAGS]: builds PKG into DIR/NAME unless it is already there.
# The binary is written under a temporary name and renamed, so an interrupted build
# never leaves a truncated binary that a later run would take for a finished one.
build() {
	local name=$1 pkg=$2 dir=$3 ldflags=${4:-}
	if [ -x "$dir/$name" ]; then
		echo "  $name: cached at $dir/$name"
		return
	fi
	mkdir -p "$dir"
	local start=$SECONDS n=0
	echo "  $name: building $pkg (a first build takes minutes on 2 cores; the control plane ~8 min)"
	# -v prints each package as it is compiled; count them so that progress is visible
	# without flooding the terminal, and pass compiler errors through.
	if ! go build -trimpath -v -ldflags "-s -w $ldflags" -o "$dir/.$name.tmp" "$pkg" 2>&1 | progress "$name" "$start"; then
		rm -f "$dir/.$name.tmp"
		echo "  $name: build of $pkg failed (see above)" >&2
		exit 1
	fi
	mv "$dir/.$name.tmp" "$dir/$name"
	echo "  $name: built in $((SECONDS - start)) s"
}

# kversion prints the -X flags that stamp Kubernetes' version into its binaries: without
# them they report v0.0.0, which clients (kubectl, client-go's discovery) and kubeadm
# (which derives its images' tags from it) refuse.
kversion() {
	local major minor kv="" p
	major=${k8s#v}; major=${major%%.*}
	minor=${k8s#v*.}; minor=${minor%%.*}
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		kv="$kv -X $p.gitVersion=$k8s -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	echo "$kv"
}

case "${1:-}" in
control-plane)
	kv=$(kversion)
	echo "control plane $k8s, etcd $etcd -> $cpdir"
	build etcd go.etcd.io/etcd/server/v3 "$cpdir"
	build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$cpdir" "$kv"
	build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$cpdir" "$kv"
	build kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$cpdir" "$kv"
	;;
kind-node)
	echo "kind node binaries $k8s -> $cpdir"
	for b in kubelet kubeadm kubectl kube-scheduler; do
		build "$b" "k8s.io/kubernetes/cmd/$b" "$cpdir" "$(kversion)"
	done
	;;
cni)
	echo "CNI plugins $cni -> $cnidir"
	build ptp github.com/containernetworking/plugins/plugins/main/ptp "$cnidir"
	build host-local github.com/containernetworking/plugins/plugins/ipam/host-local "$cnidir"
	build loopback github.com/containernetworking/plugins/plugins/main/loopback "$cnidir"
	;;
kube-router)
	# As kube-router's own Makefile builds it (CGO_ENABLED=0, the version stamped in).
	# v2.1.0 has published security advisories: it runs only inside a run's node
	# namespaces, never on the host (docs/kube-router.md).
	echo "kube-router $kr -> $krdir (takes a few minutes on 2 cores the first time)"
	cd kube-router
	CGO_ENABLED=0 build kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$krdir" \
		"-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$kr"
	;;
dir)
	echo "$cpdir"
	echo "$cnidir"
	echo "$krdir"
	;;
*)
	echo "usage: $0 control-plane|cni|kube-router|kind-node|dir" >&2
	exit 2
	;;
esac
