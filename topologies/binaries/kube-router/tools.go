//go:build tools

// Package kuberouter pins the kube-router release that `make kube-router` builds; see
// go.mod for why it is a module of its own.
package kuberouter

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
