//go:build tools

// Package actionlint pins the actionlint release that `make actionlint` builds to lint
// the vendors' GitHub Actions workflows in ci/; it is a module of its own so that its
// dependencies stay out of the project's and the Kubernetes binaries' go.sum.
package actionlint

import _ "github.com/rhysd/actionlint/cmd/actionlint"
