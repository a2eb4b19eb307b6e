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
	"path/filepath"
	"sync"
	"time"

	"github.com/dpconform/dpconform/fv/driver"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// World is a topology with an implementation running on its nodes.
type World struct {
	Topo     topologies.Topology
	Driver   driver.Driver
	Timeline *timeline.Timeline
	// Probe is how probes are run (the suite's binary, or a test binary).
	Probe probe.Program
	// ProbeStderr, if set, receives every probe's stderr.
	ProbeStderr io.Writer

	mu      sync.Mutex
	probes  []*probe.Process // clients, stopped by StopProbes
	servers []*probe.Process // servers, stopped by Cleanup
}

// New returns a World with an empty timeline.
func New(topo topologies.Topology, drv driver.Driver, prog probe.Program) *World {
	return &World{Topo: topo, Driver: drv, Timeline: timeline.New(), Probe: prog}
}

// NodeEnv is the driver's view of a node.
func NodeEnv(n topologies.Node) driver.Node { return driver.Node{Name: n.Name(), Env: n.DriverEnv()} }

// StartAll starts the agent on every node and waits until all are ready.
func (w *World) StartAll(ctx context.Context) error {
	for _, n := range w.Topo.Nodes() {
		if err := w.Start(ctx, n); err != nil {
			return err
		}
	}
	for _, n := range w.Topo.Nodes() {
		if err := w.WaitReady(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// Start asks the driver to start the agent on n, recording start-sent.
func (w *World) Start(ctx context.Context, n topologies.Node) error {
	w.Timeline.Record(timeline.StartSent, n.Name())
	return w.Driver.Start(ctx, NodeEnv(n), driver.StartOptions{})
}

// Stop stops the agent on n gracefully, recording stop-sent and exited.
func (w *World) Stop(ctx context.Context, n topologies.Node) error {
	w.Timeline.Record(timeline.StopSent, n.Name())
	if err := w.Driver.Stop(ctx, NodeEnv(n)); err != nil {
		return err
	}
	w.Timeline.Record(timeline.Exited, n.Name())
	return nil
}

// Kill crashes the agent on n, recording kill-sent and exited.
func (w *World) Kill(ctx context.Context, n topologies.Node) error {
	w.Timeline.Record(timeline.KillSent, n.Name())
	if err := w.Driver.Kill(ctx, NodeEnv(n)); err != nil {
		return err
	}
	w.Timeline.Record(timeline.Exited, n.Name())
	return nil
}

// ReadyPoll is how often WaitReady asks the driver.
const ReadyPoll = 20 * time.Millisecond

// WaitReady polls the driver's status until the agent on n is ready, then records
// ready. It fails early if the agent stops running.
func (w *World) WaitReady(ctx context.Context, n topologies.Node) error {
	var last driver.Status
	sawRunning := false
	for {
		st, err := w.Driver.Status(ctx, NodeEnv(n))
		if err != nil {
			return err
		}
		last = st
		if st.Ready {
			w.Timeline.Record(timeline.Ready, n.Name())
			return nil
		}
		if st.Running {
			sawRunning = true
		} else if sawRunning {
			return fmt.Errorf("the agent on %s stopped running before it was ready", n.Name())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent on %s is not ready (last status: running=%v ready=%v): %w", n.Name(), last.Running, last.Ready, ctx.Err())
		case <-time.After(ReadyPoll):
		}
	}
}

// Restart stops (or, if crash, kills) the agent on n, starts it and waits until it is
// ready, recording each step.
func (w *World) Restart(ctx context.Context, n topologies.Node, crash bool) error {
	var err error
	if crash {
		err = w.Kill(ctx, n)
	} else {
		err = w.Stop(ctx, n)
	}
	if err != nil {
		return err
	}
	if err := w.Start(ctx, n); err != nil {
		return err
	}
	return w.WaitReady(ctx, n)
}

// StartProbe starts a probe on h whose events go to the timeline. StopProbes stops
// client probes; servers (probe.Serve) keep running until Cleanup, across specs.
func (w *World) StartProbe(ctx context.Context, h topologies.Host, cfg probe.Config) (*probe.Process, error) {
	p, err := probe.Start(ctx, h, w.Probe, cfg, probe.Options{OnEvent: w.Timeline.Add, Stderr: w.ProbeStderr})
	if err != nil {
		return nil, fmt.Errorf("on %s: %w", h.Name(), err)
	}
	w.mu.Lock()
	if cfg.Role() == probe.RoleServe {
		w.servers = append(w.servers, p)
	} else {
		w.probes = append(w.probes, p)
	}
	w.mu.Unlock()
	return p, nil
}

// StopProbes stops every client probe gracefully (they flush their last events) and
// waits.
func (w *World) StopProbes(ctx context.Context) error {
	w.mu.Lock()
	ps := w.probes
	w.probes = nil
	w.mu.Unlock()
	return stopAll(ctx, ps)
}

// ProbeStopTimeout bounds the stop of one probe: a probe that does not stop is an
// environment error after this, not a spec that burns its whole deadline.
const ProbeStopTimeout = 30 * time.Second

func stopAll(ctx context.Context, ps []*probe.Process) error {
	var errs []error
	for _, p := range ps {
		sctx, cancel := context.WithTimeout(ctx, ProbeStopTimeout)
		if err := p.Stop(sctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	return errors.Join(errs...)
}

// Cleanup stops every probe and server and asks the driver to remove the
// implementation from every node.
func (w *World) Cleanup(ctx context.Context) error {
	w.mu.Lock()
	servers := w.servers
	w.servers = nil
	w.mu.Unlock()
	errs := []error{w.StopProbes(ctx), stopAll(ctx, servers)}
	for _, n := range w.Topo.Nodes() {
		errs = append(errs, w.Driver.Cleanup(ctx, NodeEnv(n)))
	}
	return errors.Join(errs...)
}

// Collect asks the driver for every node's diagnostics, each node into dir/<node>, and
// returns the files written.
func (w *World) Collect(ctx context.Context, dir string) ([]string, error) {
	var files []string
	var errs []error
	for _, n := range w.Topo.Nodes() {
		f, err := w.Driver.Collect(ctx, NodeEnv(n), filepath.Join(dir, n.Name()))
		files = append(files, f...)
		errs = append(errs, err)
	}
	return files, errors.Join(errs...)
}
