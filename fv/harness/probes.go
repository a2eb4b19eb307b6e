package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// StartProbe starts a probe on h whose events go to the timeline, and to each of
// observe. StopProbes stops client probes; servers (probe.Serve) keep running until
// Cleanup, across specs; reach probes (probe.Reach, see Reach) end on their own, and
// StopProbes leaves them alone, so that a scenario that stops its traffic never cuts
// a matrix short.
func (w *World) StartProbe(ctx context.Context, h topologies.Host, cfg probe.Config, observe ...func(probe.Event)) (*probe.Process, error) {
	tl := w.Timeline()
	onEvent := tl.Add
	if len(observe) > 0 {
		onEvent = func(e probe.Event) {
			tl.Add(e)
			for _, o := range observe {
				o(e)
			}
		}
	}
	p, err := probe.Start(ctx, h, w.Probe, cfg, probe.Options{OnEvent: onEvent, Stderr: w.ProbeStderr, Clock: w.probeClock(h, cfg.ProbeName())})
	if err != nil {
		return nil, fmt.Errorf("on %s: %w", h.Name(), err)
	}
	w.mu.Lock()
	switch cfg.Role() {
	case probe.RoleServe:
		w.servers = append(w.servers, p)
		if w.serverOn == nil {
			w.serverOn = map[*probe.Process]topologies.Host{}
		}
		w.serverOn[p] = h
	case probe.RoleReach:
		w.reaches = append(w.reaches, p)
	default:
		w.probes = append(w.probes, p)
	}
	w.mu.Unlock()
	return p, nil
}

// ReachStartup is what Reach allows a reach probe to start, get ready and exit, on
// top of the time its tries can take.
const ReachStartup = 15 * time.Second

// ReachBudget is how long Reach waits for cfg's probe: ReachStartup plus twice the
// longest its tries can take, ReachParallel targets at a time.
func ReachBudget(cfg probe.Reach) time.Duration {
	timeout := cmp.Or(cfg.Timeout, probe.DefaultReachTimeout)
	tries := 1
	for _, t := range cfg.Targets {
		if t.Proto == "udp" {
			tries = cmp.Or(cfg.Tries, probe.DefaultReachTries)
		}
	}
	rounds := (len(cfg.Targets) + probe.ReachParallel - 1) / probe.ReachParallel
	return ReachStartup + 2*time.Duration(rounds*tries)*timeout
}

// Reach runs a reach probe on h to completion and returns its outcomes: one
// probe.KindReach event per target, in cfg's order, its Label the target's. A cell is
// reached when its Outcome is probe.OK, and Backend then names the server that
// answered; anything else (a Timeout for a dropped flow, Refused or Reset for a
// rejected one) is not. The probe's events go on the timeline too, and it is retired
// once done (see Window).
//
// Reach waits at most ReachBudget(cfg) and as long as ctx allows. Calls may run
// concurrently, each with a probe name of its own. An error (wrapping probe.ErrProbe)
// says what went wrong with the instrument, the targets without an outcome, and the
// probe's stderr.
func (w *World) Reach(ctx context.Context, h topologies.Host, cfg probe.Reach) ([]probe.Event, error) {
	budget := ReachBudget(cfg)
	ctx, cancel := context.WithTimeoutCause(ctx, budget, fmt.Errorf("not done within its budget of %s", budget))
	defer cancel()
	p, err := w.StartProbe(ctx, h, cfg)
	if err != nil {
		return nil, err
	}
	var late error
	select {
	case <-p.Done():
	case <-ctx.Done():
		late = fmt.Errorf("%w: %s on %s: %w", probe.ErrProbe, p, h.Name(), context.Cause(ctx))
		kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = p.Kill(kctx)
		kcancel()
	}
	// The probe has exited: this only takes it off the client list and retires it.
	_ = w.StopProbe(context.WithoutCancel(ctx), p)
	evs, problem := reachOutcomes(cfg, p.Events())
	if problem != "" {
		problem = "; " + problem
	}
	switch {
	case late != nil:
		return nil, fmt.Errorf("%w%s; stderr: %s", late, problem, p.Stderr())
	case p.Err() != nil: // how it ended, with its stderr
		return nil, fmt.Errorf("on %s: %w%s", h.Name(), p.Err(), problem)
	case problem != "":
		return nil, fmt.Errorf("%w: %s on %s%s; stderr: %s", probe.ErrProbe, p, h.Name(), problem, p.Stderr())
	}
	return evs, nil
}

// reachOutcomes picks the one KindReach event of each of cfg's targets, in cfg's
// order, or says which targets have none (or only a skipped one: the probe was
// stopped, which is no verdict on the cell), or more than one.
func reachOutcomes(cfg probe.Reach, events []probe.Event) ([]probe.Event, string) {
	got := map[string][]probe.Event{}
	for _, e := range events {
		if e.Kind == probe.KindReach {
			got[e.Label] = append(got[e.Label], e)
		}
	}
	out := make([]probe.Event, 0, len(cfg.Targets))
	var missing, skipped, twice []string
	for _, t := range cfg.Targets {
		es := got[t.Label]
		delete(got, t.Label)
		switch {
		case len(es) == 0:
			missing = append(missing, fmt.Sprintf("%q", t.Label))
		case len(es) == 1 && es[0].Outcome == probe.Skipped:
			skipped = append(skipped, fmt.Sprintf("%q", t.Label))
		case len(es) == 1:
			out = append(out, es[0])
		default:
			twice = append(twice, fmt.Sprintf("%q", t.Label))
		}
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("no outcome for %d of %d targets: %s", len(missing), len(cfg.Targets), strings.Join(missing, ", ")))
	}
	if len(skipped) > 0 {
		problems = append(problems, fmt.Sprintf("stopped before it tried %d of %d targets: %s", len(skipped), len(cfg.Targets), strings.Join(skipped, ", ")))
	}
	if len(twice) > 0 {
		problems = append(problems, "more than one outcome for "+strings.Join(twice, ", "))
	}
	if len(got) > 0 {
		var unknown []string
		for l := range got {
			unknown = append(unknown, fmt.Sprintf("%q", l))
		}
		slices.Sort(unknown)
		problems = append(problems, "outcomes for targets not asked for: "+strings.Join(unknown, ", "))
	}
	return out, strings.Join(problems, "; ")
}

// WaitReported waits until every probe still running has reported through t, and
// every server through t plus grace (a datagram sent at t may still be in flight), so
// that a window ending at t can be judged. ctx bounds the wait.
func (w *World) WaitReported(ctx context.Context, t monotime.Time, grace time.Duration) error {
	w.mu.Lock()
	clients, servers := slices.Clone(w.probes), slices.Clone(w.servers)
	w.mu.Unlock()
	for _, p := range clients {
		if err := p.WaitMark(ctx, t); err != nil {
			return err
		}
	}
	for _, p := range servers {
		if err := p.WaitMark(ctx, t.Add(grace)); err != nil {
			return err
		}
	}
	return nil
}

func (w *World) StopProbes(ctx context.Context) error {
	w.mu.Lock()
	ps := w.probes
	w.probes = nil
	w.mu.Unlock()
	err := stopAll(ctx, ps)
	w.retire(ps)
	return err
}

// HoldsReleased is the transition event of ReleaseHeld.
const HoldsReleased = "holds-released"

// ReleaseHeld tells every connect probe with Hold to hold no more of the
// connections it opens (probe.Process.Release), recording holds-released: the
// connections of a transition are held, those of the settle time after it are not
// (each holds a socket on both ends, and a SNAT port on a NodePort path).
func (w *World) ReleaseHeld() error {
	w.mu.Lock()
	ps := slices.Clone(w.probes)
	w.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Release())
	}
	w.Timeline().Record(HoldsReleased, "")
	return errors.Join(errs...)
}

// StopProbe stops one client or reach probe gracefully, within ProbeStopTimeout, and
// retires it.
func (w *World) StopProbe(ctx context.Context, p *probe.Process) error {
	w.mu.Lock()
	w.probes = slices.DeleteFunc(w.probes, func(q *probe.Process) bool { return q == p })
	w.reaches = slices.DeleteFunc(w.reaches, func(q *probe.Process) bool { return q == p })
	w.mu.Unlock()
	err := stopAll(ctx, []*probe.Process{p})
	w.retire([]*probe.Process{p})
	return err
}

func (w *World) retire(ps []*probe.Process) {
	now := monotime.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.retired == nil {
		w.retired = map[string]monotime.Time{}
	}
	for _, p := range ps {
		w.retired[p.Name()] = now
	}
}

// Window is the timeline from start to end as seen by what began at from: the
// transition events before from, and everything of the client probes that were
// stopped before from, are left out. A spec that runs several rounds (a graceful
// restart, then a crash) thus judges each round on its own probes and events, on one
// timeline that every probe keeps writing to.
func (w *World) Window(from, start, end monotime.Time) timeline.Window {
	win := w.Timeline().Window(start, end)
	w.mu.Lock()
	gone := map[string]monotime.Time{}
	for name, t := range w.retired {
		if t <= from {
			gone[name] = t
		}
	}
	w.mu.Unlock()
	win.Transitions = slices.DeleteFunc(win.Transitions, func(t timeline.Transition) bool { return t.Time < from })
	win.Events = slices.DeleteFunc(win.Events, func(e probe.Event) bool {
		t, ok := gone[e.Probe]
		return ok && e.Time <= t
	})
	return win
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

// VanishPod removes pod p as a lost sandbox does (topologies.Topology.VanishPod): its
// network goes first, so its peers hear no FIN or RST. The servers that ran in it die
// with it; they leave the world unstopped, and what they reported stays on the
// timeline.
func (w *World) VanishPod(ctx context.Context, p topologies.Pod) error {
	w.mu.Lock()
	w.servers = slices.DeleteFunc(w.servers, func(s *probe.Process) bool { return w.serverOn[s] == p })
	maps.DeleteFunc(w.serverOn, func(_ *probe.Process, h topologies.Host) bool { return h == p })
	w.mu.Unlock()
	return w.Topo.VanishPod(ctx, p)
}
