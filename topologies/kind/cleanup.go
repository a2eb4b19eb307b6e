package kind

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/dpconform/dpconform/topologies/kind/dockerd"
	"github.com/dpconform/dpconform/topologies/kind/nodeimage"
)

// kindClusterLabel is the label kind puts on its node containers, the cluster's name
// its value.
const kindClusterLabel = "io.x-k8s.kind.cluster"

var runIDPattern = regexp.MustCompile(`^` + RunPrefix + `[0-9a-f]{5}$`)

// removeRun removes run id's Docker objects: its node containers with their volumes,
// its external client, its network.
func removeRun(ctx context.Context, d *dockerd.Daemon, id string, logf func(string, ...any)) error {
	var errs []error
	var ids []string
	for _, label := range []string{kindClusterLabel + "=" + id, Label + "=" + id} {
		out, err := d.Docker(ctx, "ps", "-aq", "--filter", "label="+label)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ids = append(ids, strings.Fields(string(out))...)
	}
	if len(ids) > 0 {
		logf("kind run %s: removing %d containers", id, len(ids))
		if _, err := d.Docker(ctx, append([]string{"rm", "-f", "-v"}, ids...)...); err != nil {
			errs = append(errs, err)
		}
	}
	out, err := d.Docker(ctx, "network", "ls", "-q", "--filter", "label="+Label+"="+id)
	if err != nil {
		errs = append(errs, err)
	} else if nets := strings.Fields(string(out)); len(nets) > 0 {
		if _, err := d.Docker(ctx, append([]string{"network", "rm"}, nets...)...); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// runsOf lists the run IDs that own Docker objects of the daemon.
func runsOf(ctx context.Context, d *dockerd.Daemon) (map[string]bool, error) {
	runs := map[string]bool{}
	for _, q := range [][]string{
		{"ps", "-a", "--format", `{{.Label "` + kindClusterLabel + `"}} {{.Label "` + Label + `"}}`},
		{"network", "ls", "--format", `{{.Label "` + Label + `"}}`},
	} {
		out, err := d.Docker(ctx, q...)
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Fields(string(out)) {
			if runIDPattern.MatchString(f) {
				runs[f] = true
			}
		}
	}
	return runs, nil
}

// reapRuns removes the Docker objects and run directories of runs under root whose
// owner is gone, and objects of runs that have no directory at all (a run directory
// removed by hand or by a reboot's clean /tmp).
func reapRuns(ctx context.Context, d *dockerd.Daemon, root string, logf func(string, ...any)) error {
	runs, err := runsOf(ctx, d)
	if err != nil {
		return err
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if runIDPattern.MatchString(e.Name()) {
			runs[e.Name()] = true
		}
	}
	var errs []error
	for id := range runs {
		dir := filepath.Join(root, id)
		if ownerAlive(dir) {
			continue
		}
		logf("kind: removing run %s, whose owner is gone", id)
		errs = append(errs, removeRun(ctx, d, id, logf), os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// CleanupOptions select what Cleanup removes.
type CleanupOptions struct {
	// RunRoot is where run directories live (default DefaultRunRoot()).
	RunRoot string
	// Images also removes the images the project built (node image, root
	// filesystem, component and probe images): the next kind run rebuilds them.
	Images bool
	Logf   func(format string, args ...any)
}

// Cleanup removes what killed kind runs left: their clusters, containers, networks
// and run directories, and with Images the images the project built. It starts the
// project's dockerd only when there is something of it to look at, and stops it
// after. It leaves runs whose owner is alive alone.
func Cleanup(ctx context.Context, opts CleanupOptions) error {
	if opts.RunRoot == "" {
		opts.RunRoot = DefaultRunRoot()
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if _, err := os.Stat(filepath.Join(DockerRoot(), "data")); err != nil {
		return nil
	}
	if _, err := os.Stat("/usr/bin/dockerd"); err != nil {
		// No engine to ask: nothing can have run.
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	d, err := dockerd.Start(ctx, dockerd.Options{Root: DockerRoot(), Logf: logf, Wait: time.Second})
	if errors.Is(err, dockerd.ErrBusy) {
		// A live kind run holds the daemon; it removes what it makes, and its own
		// start reaps what killed runs left.
		logf("kind: a live run holds the project's dockerd; nothing of it to clean up now")
		return nil
	}
	if err != nil {
		return fmt.Errorf("kind cleanup: %w", err)
	}
	errs := []error{reapRuns(ctx, d, opts.RunRoot, logf)}
	if opts.Images {
		out, err := d.Docker(ctx, "images", "--format", "{{.Repository}}:{{.Tag}}")
		errs = append(errs, err)
		var rm []string
		for _, im := range strings.Fields(string(out)) {
			if strings.HasPrefix(im, "dpconform.local/") || strings.HasPrefix(im, "registry.k8s.io/") {
				rm = append(rm, im)
			}
		}
		if len(rm) > 0 {
			logf("kind: removing %d images the project built (%s among them)", len(rm), nodeimage.Tag())
			_, err := d.Docker(ctx, append([]string{"rmi", "-f"}, rm...)...)
			errs = append(errs, err)
		}
	}
	errs = append(errs, d.Stop())
	return errors.Join(errs...)
}
