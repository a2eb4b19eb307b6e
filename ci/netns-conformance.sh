#!/usr/bin/env bash
# Run the dpconform suite on a netns topology against a driver, on a Debian or Ubuntu
# runner where the job is root (a vendor's CI, or a VM). Installs what is missing,
# builds the suite and the third-party binaries it runs (cached in ~/.cache/dpconform),
# runs it, and leaves report.yaml and junit.xml in _output/conformance.
#
#   ci/netns-conformance.sh /path/to/your-driver [Core,ModeSwitch]
#
# Without a driver it certifies the reference dataplane.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
driver=${1:-}
profiles=${2:-}
if [ "$(id -u)" != 0 ]; then
	echo "netns-conformance: needs root (network namespaces, veth, tc, iptables)" >&2
	exit 1
fi
make deps binaries build
args=(--driver "${driver:-_output/bin/refdp-driver}" --output _output/conformance)
[ -n "$profiles" ] && args+=(--profiles "$profiles")
status=0
_output/bin/dpconform run "${args[@]}" || status=$?
# Whatever happened, leave the runner clean for the next job.
_output/bin/dpconform cleanup || true
exit "$status"
