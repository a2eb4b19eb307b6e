package kind

import (
	"path/filepath"

	"github.com/dpconform/dpconform/topologies/controlplane"
)

// CacheDir is where the kind topology keeps what it builds: the project's Docker
// data-root (node image, root filesystem, component images) and build scratch space.
func CacheDir() string { return filepath.Join(controlplane.CacheDir(), "kind") }

// DockerRoot is the directory of the project's dockerd (dockerd.Options.Root).
func DockerRoot() string { return filepath.Join(CacheDir(), "docker") }
