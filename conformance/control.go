package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// controlPort is where the control flow's server listens in the external client.
const controlPort = 9999

// control is a flow that crosses no dataplane: from the suite's own namespace to the
// external client, over the fabric. If it fails, the environment is broken.
type control struct {
	tl      *timeline.Timeline
	start   monotime.Time
	server  *probe.Process
	connect *probe.Process
	done    bool // finish has stopped the probes
}

// suiteHost runs processes in the suite's own network namespace.
type suiteHost struct{}

func (suiteHost) Name() string { return "suite" }

func (suiteHost) IP() netip.Addr { return netip.Addr{} }

func (suiteHost) Start(cmd *exec.Cmd) error { return cmd.Start() }

func startControl(ctx context.Context, topo topologies.Topology, cfg Config) (*control, error) {
	c := &control{tl: timeline.New()}
	opts := probe.Options{OnEvent: c.tl.Add, Stderr: cfg.ProbeStderr}
	var err error
	c.server, err = probe.Start(ctx, topo.External(), cfg.Probe, probe.Serve{Name: "control-server", TCP: []int{controlPort}}, opts)
	if err != nil {
		return nil, err
	}
	target := net.JoinHostPort(topo.External().IP().String(), fmt.Sprint(controlPort))
	// A gentler rate than the specs' probes: it watches the environment, not latency.
	c.connect, err = probe.Start(ctx, suiteHost{}, cfg.Probe, probe.Connect{Name: "control", Target: target, Interval: cfg.Budgets.ControlInterval}, opts)
	if err != nil {
		c.server.Kill(ctx)
		return nil, err
	}
	c.start = monotime.Now()
	return c, nil
}

// kill stops the control flow's probes unless finish did: a run that ended early (a
// body that panicked) must not leave a probe of the suite's namespace hammering an
// address the next run's fabric reuses.
func (c *control) kill(ctx context.Context) {
	if c.done {
		return
	}
	c.done = true
	c.connect.Kill(ctx)
	c.server.Kill(ctx)
}

func (c *control) finish(ctx context.Context, b Budgets) error {
	end := monotime.Now()
	c.done = true
	errs := []error{c.connect.Stop(ctx), c.server.Stop(ctx)}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	win := c.tl.Window(c.start, end)
	m := matchers.HaveNoFailedAttempts(matchers.Probes("control"), matchers.MaxBlind(b.ControlMaxBlind))
	ok, err := m.Match(win)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New(m.FailureMessage(win))
	}
	return nil
}
