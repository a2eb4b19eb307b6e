package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Build is a directory of Calico binaries as `make calico` makes it
// (topologies/binaries/calico/build.sh):
//
//	BUILDINFO          what was built, from what (BuildInfo), written last
//	bin/calico-felix   Felix, with cgo and libbpf
//	bin/calico-bpf     Calico's BPF debugging tool (the diagnostics use it)
//	bpf/*.o            Felix's BPF programs, which it loads from /usr/lib/calico/bpf
//	cni/calico         Calico's CNI plugin
//	crds/*.yaml        Calico's CRDs (libcalico-go/config/crd)
type Build struct {
	Dir string
	BuildInfo
}

// BuildInfo is BUILDINFO: the version and commit the binaries were built from.
type BuildInfo struct {
	// Version is what Calico's own build stamps: `git describe --tags --dirty
	// --always --abbrev=12` of the source tree (v3.31.5), or CALICO_VERSION.
	Version string `json:"version"`
	// Commit is the source tree's git commit, "unknown" for a tree without git.
	Commit string `json:"commit"`
	// Dirty says the tree had uncommitted changes to tracked files.
	Dirty bool `json:"dirty"`
	// Patch names the patch make calico applied to the tree (CALICO_PATCH), with its
	// SHA-256: a change the commit does not have.
	Patch  string `json:"patch,omitempty"`
	LibBPF string `json:"libbpf"`
	Go     string `json:"go"`
	Clang  string `json:"clang"`
	Built  string `json:"built"`
	// Pinned lists the dependencies the module proxy refused at the release's
	// version, and what they were replaced with: "k8s.io/kubernetes v1.33.10 -> v1.33.9".
	Pinned []string `json:"pinned"`
}

// LoadBuild reads and checks the build in dir: every file the driver needs is there.
func LoadBuild(dir string) (*Build, error) {
	if !filepath.IsAbs(dir) {
		return nil, errors.New("not an absolute path")
	}
	data, err := os.ReadFile(filepath.Join(dir, "BUILDINFO"))
	if err != nil {
		return nil, fmt.Errorf("no complete build here: %w", err)
	}
	b := &Build{Dir: dir}
	if err := yaml.UnmarshalStrict(data, &b.BuildInfo); err != nil {
		return nil, fmt.Errorf("BUILDINFO: %w", err)
	}
	if b.Version == "" || b.Commit == "" {
		return nil, errors.New("BUILDINFO names no version or commit")
	}
	var errs []error
	for _, f := range []string{b.Felix(), b.CalicoBPF(), filepath.Join(b.CNIDir(), "calico")} {
		if err := executable(f); err != nil {
			errs = append(errs, err)
		}
	}
	for _, glob := range []string{filepath.Join(b.ObjectDir(), "*.o"), filepath.Join(b.CRDDir(), "*.yaml")} {
		if m, _ := filepath.Glob(glob); len(m) == 0 {
			errs = append(errs, fmt.Errorf("nothing matches %s", glob))
		}
	}
	return b, errors.Join(errs...)
}

// Describe is the version the driver reports: the version, the commit, and what
// makes the binaries differ from the release's own.
func (b *Build) Describe() string {
	var notes []string
	if b.Commit != "unknown" {
		notes = append(notes, "commit "+b.Commit)
	}
	if b.Patch != "" {
		notes = append(notes, "patched: "+b.Patch)
	}
	if len(b.Pinned) > 0 {
		notes = append(notes, fmt.Sprintf("%d dependencies at other patch versions: %s", len(b.Pinned), strings.Join(b.Pinned, ", ")))
	}
	if len(notes) == 0 {
		return b.Version
	}
	return b.Version + " (" + strings.Join(notes, "; ") + ")"
}

// Felix is the calico-felix binary.
func (b *Build) Felix() string { return filepath.Join(b.Dir, "bin", "calico-felix") }

// CalicoBPF is the calico-bpf binary.
func (b *Build) CalicoBPF() string { return filepath.Join(b.Dir, "bin", "calico-bpf") }

// ObjectDir holds Felix's BPF objects.
func (b *Build) ObjectDir() string { return filepath.Join(b.Dir, "bpf") }

// CNIDir holds the calico CNI plugin: the driver's info.cni_dir.
func (b *Build) CNIDir() string { return filepath.Join(b.Dir, "cni") }

// CRDDir holds Calico's CRDs.
func (b *Build) CRDDir() string { return filepath.Join(b.Dir, "crds") }
