// Package harness is the world a transition runs in: a topology, the implementation
// under test behind its driver, the probes that measure traffic, and one timeline
// where the probes' events and the suite's transition events meet. Each step of a
// transition (stop, kill, start, ready) is recorded on the timeline as it happens.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/drivers/kubeproxy"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// ErrNotReady marks an agent that did not report ready within its budget, or stopped
// running before it was: a verdict on the implementation, not an error of the run.
var ErrNotReady = errors.New("not ready")

// World is a topology with an implementation running on its nodes.
type World struct {
	Topo   topologies.Topology
	Driver driver.Driver
	// Probe is how probes are run (the suite's binary, or a test binary).
	Probe probe.Program
	// ProbeStderr, if set, receives every probe's stderr.
	ProbeStderr io.Writer
	// StartOptions are what every Start passes to the driver (a mode, a version,
	// settings); zero for the implementation's default.
	StartOptions driver.StartOptions
	// ReadyTimeout bounds each WaitReady (default DefaultReadyTimeout): the wait for
	// the implementation under test. The real kube-proxy that holds a node before a
	// switch is part of the world, not the implementation, and is bounded by
	// KubeProxyReadyTimeout instead, so that a budget tightened for the
	// implementation (a stub that never becomes ready) does not fail its set-up.
	ReadyTimeout time.Duration
	// ClockAlignmentOff leaves every time a host writes on that host's clock, as if
	// it were the suite's: a test's switch, to show that alignment does the work.
	ClockAlignmentOff bool

	mu sync.Mutex
	// timeline records what happens in the world (Timeline, NewTimeline).
	timeline atomic.Pointer[timeline.Timeline]
	// nodeOpts are the options each node was last started with, where StartWith
	// gave others than StartOptions; starts are the distinct start calls made.
	nodeOpts  map[string]driver.StartOptions
	starts    []string
	probes    []*probe.Process // clients, stopped by StopProbes
	servers   []*probe.Process // servers, stopped by Cleanup
	serverOn  map[*probe.Process]topologies.Host
	reaches   []*probe.Process // reach probes, which end on their own (Reach waits)
	retired   map[string]monotime.Time
	kubeProxy map[string]*kubeproxy.Fixture // by node, while it holds the node
	// clocks are the hosts' clocks (MeasureClocks), by host; clockProbes answer
	// their exchanges; probeHost is the host of each probe the world started.
	clocks      map[string]*HostClock
	clockProbes []clockProbe
	probeHost   map[string]string
}

// DefaultReadyTimeout is how long WaitReady waits when World.ReadyTimeout is zero.
const DefaultReadyTimeout = 60 * time.Second

// New returns a World with an empty timeline.
func New(topo topologies.Topology, drv driver.Driver, prog probe.Program) *World {
	w := &World{Topo: topo, Driver: drv, Probe: prog}
	w.timeline.Store(timeline.New())
	return w
}

// Timeline is where the world records what happens in it: probes' events, the
// transitions the harness drives, and the steps a spec records.
func (w *World) Timeline() *timeline.Timeline { return w.timeline.Load() }

// NewTimeline starts a new timeline for what the world does from now on (a test's
// next case in the same world) and returns it. Probes started before keep writing
// into the one they were given.
func (w *World) NewTimeline() *timeline.Timeline {
	tl := timeline.New()
	w.timeline.Store(tl)
	return tl
}

// NodeEnv is the driver's view of a node.
// On the netns topology a driver call runs inside the node (docs/driver.md).
func NodeEnv(n topologies.Node) driver.Node {
	return driver.Node{Name: n.Name(), Env: n.DriverEnv(), Start: n.StartDriver}
}

// Cleanup stops every probe and server, removes every pod (while the implementation
// still runs, for its CNI DEL), removes kube-proxy and its rules from the nodes it
// still ran on or left rules on, and asks the driver to remove the implementation
// from every node.
func (w *World) Cleanup(ctx context.Context) error {
	w.mu.Lock()
	servers, reaches := w.servers, w.reaches
	w.servers, w.reaches, w.serverOn = nil, nil, nil
	kps := w.kubeProxy
	w.kubeProxy = nil
	var clockProbes []*probe.Process
	for _, cp := range w.clockProbes {
		clockProbes = append(clockProbes, cp.p)
	}
	w.clockProbes = nil
	w.mu.Unlock()
	errs := []error{w.StopProbes(ctx), stopAll(ctx, reaches), stopAll(ctx, servers), stopAll(ctx, clockProbes)}
	// Pods go before the implementation's clean-up, as a node is drained: a CNI DEL
	// may need the agent (Cilium's and Calico's plugins ask it), which the driver's
	// clean-up stops.
	for _, p := range w.Topo.Pods() {
		if err := w.Topo.RemovePod(ctx, p); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", p.Name(), err))
		}
	}
	for _, n := range w.Topo.Nodes() {
		errs = append(errs, w.Driver.Cleanup(ctx, NodeEnv(n)))
		if f := kps[n.Name()]; f != nil {
			if err := f.Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("kube-proxy on %s: %w", n.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Collect asks the driver for every node's diagnostics, each node into dir/<node>
// (created here, before the call), and returns the files that exist afterwards: a
// file the driver names but did not write is not reported. Relative names are taken
// as relative to the node's directory.
func (w *World) Collect(ctx context.Context, dir string) ([]string, error) {
	// The driver runs inside the node, whose working directory is not the suite's:
	// it gets the directory by its absolute path.
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	var errs []error
	for _, n := range w.Topo.Nodes() {
		nodeDir := filepath.Join(dir, n.Name())
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("diagnostics of %s: %w", n.Name(), err))
			continue
		}
		got, err := w.Driver.Collect(ctx, NodeEnv(n), nodeDir)
		errs = append(errs, err)
		for _, f := range got {
			if !filepath.IsAbs(f) {
				f = filepath.Join(nodeDir, f)
			}
			if st, err := os.Stat(f); err == nil && !st.IsDir() {
				files = append(files, f)
			}
		}
		w.mu.Lock()
		kp := w.kubeProxy[n.Name()]
		w.mu.Unlock()
		if kp != nil {
			kf, err := kp.Diagnostics(ctx, filepath.Join(nodeDir, "kube-proxy"))
			files = append(files, kf...)
			errs = append(errs, err)
		}
	}
	return files, errors.Join(errs...)
}
