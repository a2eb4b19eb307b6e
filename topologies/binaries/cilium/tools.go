//go:build tools

// Package cilium pins the Cilium release that `make cilium` builds; see go.mod for why
// it is a module of its own.
package cilium

import (
	_ "github.com/cilium/cilium/daemon"
	_ "github.com/cilium/cilium/plugins/cilium-cni"
)
