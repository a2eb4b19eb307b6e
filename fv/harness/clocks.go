package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
)

// A world whose hosts have clocks of their own (topologies.OwnClocks: other
// machines, or time namespaces) relates each to the suite's by measurement before
// anything runs: a clock probe on every node and on the external client answers
// clock exchanges over its control channel (probe.Process.ReadClock), and the
// exchange of least round trip gives the host's offset and a bound on its error
// (package clocks). Every time a probe on the host writes, and every verdict its
// node's driver reports, is converted with that offset as it arrives; a pod reads its
// node's clock. FinishClocks measures again at the end, which bounds the drift.

// HostClock is one host's clock over a run.
type HostClock struct {
	Host string
	clocks.Span
}

// clockHost is the host whose clock h reads: a pod's node, or h itself.
func clockHost(h topologies.Host) string {
	if p, ok := h.(topologies.Pod); ok {
		return p.NodeName()
	}
	return h.Name()
}

// MeasureClocks relates the clock of every node and of the external client to the
// suite's, if the topology says they have clocks of their own, and keeps a clock
// probe on each for FinishClocks. It does nothing on a topology of one clock.
func (w *World) MeasureClocks(ctx context.Context) error {
	if !topologies.HasOwnClocks(w.Topo) {
		return nil
	}
	hosts := []topologies.Host{w.Topo.External()}
	for _, n := range w.Topo.Nodes() {
		hosts = append(hosts, n)
	}
	for _, h := range hosts {
		p, err := probe.Start(ctx, h, w.Probe, probe.Clock{Name: "clock-" + h.Name()}, probe.Options{Stderr: w.ProbeStderr})
		if err != nil {
			return fmt.Errorf("the clock probe of %s: %w", h.Name(), err)
		}
		w.mu.Lock()
		w.clockProbes = append(w.clockProbes, clockProbe{host: h.Name(), p: p})
		w.mu.Unlock()
		est, err := clocks.Measure(ctx, p, clocks.Exchanges)
		if err != nil {
			return fmt.Errorf("measure the clock of %s: %w", h.Name(), err)
		}
		w.mu.Lock()
		if w.clocks == nil {
			w.clocks = map[string]*HostClock{}
		}
		w.clocks[h.Name()] = &HostClock{Host: h.Name(), Span: clocks.Span{First: est}}
		w.mu.Unlock()
	}
	return nil
}

// clockProbe is the clock probe on a host.
type clockProbe struct {
	host string
	p    *probe.Process
}

// FinishClocks measures each host's clock again, stops the clock probes, and returns
// every host's clock over the run, sorted by host. A world of one clock has none.
func (w *World) FinishClocks(ctx context.Context) ([]HostClock, error) {
	w.mu.Lock()
	cps := w.clockProbes
	w.clockProbes = nil
	w.mu.Unlock()
	var errs []error
	ps := make([]*probe.Process, len(cps))
	for i, cp := range cps {
		ps[i] = cp.p
		est, err := clocks.Measure(ctx, cp.p, clocks.Exchanges)
		if err != nil {
			errs = append(errs, fmt.Errorf("measure the clock of %s again: %w", cp.host, err))
			continue
		}
		w.mu.Lock()
		if hc := w.clocks[cp.host]; hc != nil {
			hc.Last = est
		}
		w.mu.Unlock()
	}
	errs = append(errs, stopAll(ctx, ps))
	return w.Clocks(), errors.Join(errs...)
}

// Clocks is every host's clock as measured so far, sorted by host.
func (w *World) Clocks() []HostClock {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]HostClock, 0, len(w.clocks))
	for _, hc := range w.clocks {
		out = append(out, *hc)
	}
	slices.SortFunc(out, func(a, b HostClock) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// toSuite converts t, read on host's clock, to the suite's. A host the world has not
// measured reads the suite's clock (the suite's own namespace), and so does every host
// when alignment is off (ClockAlignmentOff).
func (w *World) toSuite(host string, t monotime.Time) monotime.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.converterLocked(host)(t)
}

// converterLocked is toSuite for one host, fixed: the estimate a host's times are
// converted with is the one MeasureClocks made, all run long. w.mu is held.
func (w *World) converterLocked(host string) func(monotime.Time) monotime.Time {
	hc := w.clocks[host]
	if hc == nil || w.ClockAlignmentOff {
		return func(t monotime.Time) monotime.Time { return t }
	}
	return hc.First.ToSuite
}

// probeClock is the conversion a probe named name on h is started with
// (probe.Options.Clock), nil in a world of one clock. A probe's own times are its
// host's; a server's KindRecv also carries the sender's stamp, converted by the
// clock of the host the world started the sender on.
func (w *World) probeClock(h topologies.Host, name string) func(string, monotime.Time) monotime.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.clocks) == 0 {
		return nil
	}
	if w.probeHost == nil {
		w.probeHost = map[string]string{}
	}
	w.probeHost[name] = clockHost(h)
	own := w.converterLocked(clockHost(h))
	return func(probeName string, t monotime.Time) monotime.Time {
		if probeName == name {
			return own(t)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		host, ok := w.probeHost[probeName]
		if !ok {
			return t // not the world's: the suite's own namespace
		}
		return w.converterLocked(host)(t)
	}
}
