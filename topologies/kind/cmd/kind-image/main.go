// Command kind-image builds the kind node image offline (`make kind-image`): it starts
// the project's dockerd, builds what is missing (topologies/kind/nodeimage says what
// and from what), and stops the daemon. The image stays in the daemon's data-root
// under the kind cache, where the kind topology finds it.
//
// Environment: DPC_CACHE_DIR (the cache root), DPC_DEBIAN_MIRROR (the mirror
// debootstrap uses; default: apt's).
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dpconform/dpconform/topologies/controlplane"
	"github.com/dpconform/dpconform/topologies/kind"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
	"github.com/dpconform/dpconform/topologies/kind/nodeimage"
)

func main() {
	dockerd.RuntimeWrapperMain()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kind-image:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	kindDir, err := moduleDir(ctx, "sigs.k8s.io/kind")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(kind.CacheDir(), 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(kind.CacheDir(), "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	pause := filepath.Join(work, "pause")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", pause, "./topologies/kind/cmd/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build pause: %w: %s", err, out)
	}
	d, err := dockerd.Start(ctx, dockerd.Options{Root: kind.DockerRoot(), Logf: logf})
	if err != nil {
		return err
	}
	defer d.Stop()
	tag, err := nodeimage.Build(ctx, nodeimage.Options{
		Daemon:   d,
		KindDir:  kindDir,
		Binaries: filepath.Join(controlplane.CacheDir(), "control-plane", "k8s-"+controlplane.KubernetesVersion+"-etcd-"+controlplane.EtcdVersion),
		Pause:    pause,
		Mirror:   os.Getenv("DPC_DEBIAN_MIRROR"),
		WorkDir:  work,
		Logf:     logf,
	})
	if err != nil {
		return err
	}
	fmt.Println(tag)
	return d.Stop()
}

// moduleDir returns the directory of a module of the build list, downloading it if
// needed.
func moduleDir(ctx context.Context, mod string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && k == `"Dir"` {
			return strings.Trim(strings.TrimSpace(v), `",`), nil
		}
	}
	return "", fmt.Errorf("go mod download %s: no directory in %s", mod, out)
}
