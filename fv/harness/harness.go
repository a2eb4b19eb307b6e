// Package harness is the world a transition runs in: a topology, the implementation
// under test behind its driver, the probes that measure traffic, and one timeline
// where the probes' events and the suite's transition events meet. Each step of a
// transition (stop, kill, start, ready) is recorded on the timeline as it happens.
package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	Topo     topologies.Topology
	Driver   driver.Driver
	Timeline *timeline.Timeline
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

	mu sync.Mutex
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
}

// DefaultReadyTimeout is how long WaitReady waits when World.ReadyTimeout is zero.
const DefaultReadyTimeout = 60 * time.Second

// KubeProxyReadyTimeout is how long StartKubeProxy waits for kube-proxy to have
// written its rules for both IP families. Quiet, that takes 0.9-1.8 s
// (docs/kube-proxy.md); a loaded machine has made it exceed 2 s.
const KubeProxyReadyTimeout = 60 * time.Second

// New returns a World with an empty timeline.
func New(topo topologies.Topology, drv driver.Driver, prog probe.Program) *World {
	return &World{Topo: topo, Driver: drv, Timeline: timeline.New(), Probe: prog}
}

// NodeEnv is the driver's view of a node.
// On the netns topology a driver call runs inside the node (docs/driver.md).
func NodeEnv(n topologies.Node) driver.Node {
	return driver.Node{Name: n.Name(), Env: n.DriverEnv(), Start: n.StartDriver}
}

// StartAll starts the agent on every node and waits until all are ready.
func (w *World) StartAll(ctx context.Context) error {
	return w.StartOn(ctx, w.Topo.Nodes())
}

// StartOn starts the agent on nodes and waits until all are ready.
func (w *World) StartOn(ctx context.Context, nodes []topologies.Node) error {
	for _, n := range nodes {
		if err := w.Start(ctx, n); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		if err := w.WaitReady(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// Start asks the driver to start the agent on n with the options it was last
// started with (the World's StartOptions, unless StartWith gave others),
// recording start-sent.
func (w *World) Start(ctx context.Context, n topologies.Node) error {
	w.mu.Lock()
	opts, ok := w.nodeOpts[n.Name()]
	w.mu.Unlock()
	if !ok {
		opts = w.StartOptions
	}
	return w.StartWith(ctx, n, opts)
}

// StartWith asks the driver to start the agent on n with opts (a version, settings
// other than StartOptions': an upgrade), recording start-sent with the call when it
// has options. Later Starts of n use opts too.
func (w *World) StartWith(ctx context.Context, n topologies.Node, opts driver.StartOptions) error {
	call := opts.String()
	w.mu.Lock()
	if w.nodeOpts == nil {
		w.nodeOpts = map[string]driver.StartOptions{}
	}
	w.nodeOpts[n.Name()] = opts
	if !slices.Contains(w.starts, call) {
		w.starts = append(w.starts, call)
	}
	w.mu.Unlock()
	detail := n.Name()
	if len(opts.Args()) > 0 {
		detail += ": " + call
	}
	w.Timeline.Record(timeline.StartSent, detail)
	return w.Driver.Start(ctx, NodeEnv(n), opts)
}

// Starts lists the distinct start calls the World made, in order, e.g.
// ["start --version v1", "start --version v2"]: what the report records of the
// variants a spec ran.
func (w *World) Starts() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.starts)
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

// ReadyPoll is the shortest time between the end of one of WaitReady's status calls
// and the start of the next.
const ReadyPoll = 20 * time.Millisecond

// readyPollCost is how many times its own duration WaitReady waits after a status call
// before the next, if that is longer than ReadyPoll: a status call is a process, and
// on a cluster also a kubeconfig, a TLS handshake and an API request, and asked back
// to back for the seconds an agent takes to start, these calls took a share of the
// machine whose schedule the probes measure (docs/architecture.md, "The suite asks
// slow drivers less often"). An agent's ready time loses nothing by it when its
// driver says when it became ready (ReadySinceNS); when it does not, the later
// ready time narrows the checks that start there and widens those that end after it.
const readyPollCost = 3

// readyPause is how long WaitReady waits after a status call that took took.
func readyPause(took time.Duration) time.Duration {
	return max(ReadyPoll, readyPollCost*took)
}

// readyAt is when to record an agent ready that a status reply, between asked and
// seen, said was: when the driver says it became ready (ReadySinceNS), if that falls
// in the wait, else when the suite saw it. The earlier time can only widen the checks
// that start at ready, so a driver gains nothing by it; a time before the wait (a
// previous agent's) is not taken.
func readyAt(asked, seen monotime.Time, sinceNS int64) monotime.Time {
	if since := monotime.Time(sinceNS); since >= asked && since < seen {
		return since
	}
	return seen
}

// WaitReady polls the driver's status until the agent on n is ready, then records
// ready. An agent that is not ready within ReadyTimeout, or stops running before it
// is, is an ErrNotReady. A status call that misses its own deadline (a loaded machine)
// is asked again until the budget is spent; any other driver error ends the wait.
func (w *World) WaitReady(ctx context.Context, n topologies.Node) error {
	budget := cmp.Or(w.ReadyTimeout, DefaultReadyTimeout)
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var last driver.Status
	var lastErr error
	sawRunning := false
	asked := monotime.Now()
	for {
		called := time.Now()
		st, err := w.Driver.Status(ctx, NodeEnv(n))
		pause := readyPause(time.Since(called))
		switch {
		case err != nil && ctx.Err() == nil && driver.IsTimeout(err):
			lastErr = err
		case err != nil && ctx.Err() != nil && driver.IsTimeout(err) && lastErr != nil:
			// Every call ran out of time: the driver does not answer.
			return lastErr
		case err != nil && ctx.Err() != nil:
			// The wait ran out during a call.
		case err != nil:
			return err
		default:
			lastErr = nil
			last = st
			if st.Ready {
				w.Timeline.RecordAt(readyAt(asked, monotime.Now(), st.ReadySinceNS), timeline.Ready, n.Name())
				return nil
			}
			if st.Running {
				sawRunning = true
			} else if sawRunning {
				return fmt.Errorf("%w: the agent on %s stopped running before it was ready", ErrNotReady, n.Name())
			}
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return lastErr
			}
			return fmt.Errorf("%w: the agent on %s did not report ready within %s (last status: running=%v ready=%v)", ErrNotReady, n.Name(), budget, last.Running, last.Ready)
		case <-time.After(pause):
		}
	}
}

// Restart stops (or, if crash, kills) the agent on n, starts it and waits until it is
// ready, recording each step.
func (w *World) Restart(ctx context.Context, n topologies.Node, crash bool) error {
	if err := w.stopOrKill(ctx, n, crash); err != nil {
		return err
	}
	if err := w.Start(ctx, n); err != nil {
		return err
	}
	return w.WaitReady(ctx, n)
}

// Upgrade is Restart with the start's options changed to opts: another version of
// the agent, other settings (StartWith).
func (w *World) Upgrade(ctx context.Context, n topologies.Node, crash bool, opts driver.StartOptions) error {
	if err := w.stopOrKill(ctx, n, crash); err != nil {
		return err
	}
	if err := w.StartWith(ctx, n, opts); err != nil {
		return err
	}
	return w.WaitReady(ctx, n)
}

func (w *World) stopOrKill(ctx context.Context, n topologies.Node, crash bool) error {
	if crash {
		return w.Kill(ctx, n)
	}
	return w.Stop(ctx, n)
}

// Names of the transition events of kube-proxy on a node that is switched over.
const (
	KubeProxyReady    = "kube-proxy-ready"
	KubeProxyStopSent = "kube-proxy-stop-sent"
	KubeProxyExited   = "kube-proxy-exited"
)

// KubeProxyDir is where, under a node's state directory, the kube-proxy that runs
// before a switch keeps its files: apart from the implementation's, which may be a
// kube-proxy too.
const KubeProxyDir = "kube-proxy-before-switch"

// StartKubeProxy runs the real kube-proxy (iptables mode) on n in place of the
// implementation, with the node's FORWARD policy DROP and accepts only for its own
// pods' traffic (LocalPodsChain), so that kube-proxy's KUBE-FORWARD accept is what
// carries flows that enter and leave by the host interface; and waits until it has
// synced, recording kube-proxy-ready.
func (w *World) StartKubeProxy(ctx context.Context, n topologies.Node) error {
	if w.Topo.Provider() != "netns" {
		// The fixture runs the kube-proxy binary inside a netns node; on kind,
		// kube-proxy is a DaemonSet of the cluster, which no spec set-up deploys yet.
		return fmt.Errorf("%w: kube-proxy before a switch runs only on the netns topology (on %s it would be the cluster's DaemonSet)", topologies.ErrUnsupported, w.Topo.Provider())
	}
	f, err := KubeProxyFor(n, kubeproxy.IPTables)
	if err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	f.Dir = filepath.Join(f.Dir, KubeProxyDir)
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	if err := localPodsOnly(ctx, n); err != nil {
		return err
	}
	w.mu.Lock()
	if w.kubeProxy == nil {
		w.kubeProxy = map[string]*kubeproxy.Fixture{}
	}
	w.kubeProxy[n.Name()] = f
	w.mu.Unlock()
	if _, err := f.Start(ctx); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	rctx, cancel := context.WithTimeout(ctx, KubeProxyReadyTimeout)
	defer cancel()
	if err := f.WaitReady(rctx); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w", n.Name(), err)
	}
	w.Timeline.Record(KubeProxyReady, n.Name())
	return nil
}

// LocalPodsChain is the chain of the filter table that, before a switch, accepts
// forwarded traffic from and to the node's own pods, as the CNI or dataplane of a
// node with kube-proxy does (Calico's FORWARD accepts only its workloads' interfaces).
// Traffic that enters and leaves by the host interface, a NodePort flow to a backend
// on another node, is then carried only by kube-proxy's KUBE-FORWARD accept: the
// traffic of Calico PR 13778.
const LocalPodsChain = "DPC-LOCAL-PODS"

// localPodsOnly sets n's FORWARD policy DROP and accepts forwarded traffic of the
// node's pods (its pod CIDR) in LocalPodsChain.
func localPodsOnly(ctx context.Context, n topologies.Node) error {
	cidr := n.PodCIDR().String()
	for _, args := range [][]string{
		{"-P", "FORWARD", "DROP"},
		{"-N", LocalPodsChain},
		{"-A", LocalPodsChain, "-s", cidr, "-m", "comment", "--comment", "dpconform: the node's pods", "-j", "ACCEPT"},
		{"-A", LocalPodsChain, "-d", cidr, "-m", "comment", "--comment", "dpconform: the node's pods", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-j", LocalPodsChain},
	} {
		if out, err := topologies.Output(ctx, n, "iptables", append([]string{"-w", "5"}, args...)...); err != nil {
			return fmt.Errorf("FORWARD on %s (iptables %s): %w: %s", n.Name(), strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// Switch hands node n over from kube-proxy to the implementation, as a DaemonSet
// rollout does: kube-proxy is stopped and leaves its rules and the Linux conntrack
// table in place, then the implementation is started; Switch returns once it is
// ready.
func (w *World) Switch(ctx context.Context, n topologies.Node) error {
	w.mu.Lock()
	f := w.kubeProxy[n.Name()]
	w.mu.Unlock()
	if f == nil {
		return fmt.Errorf("switch %s: kube-proxy does not run there (the spec's Setup must name the node in KubeProxy)", n.Name())
	}
	w.Timeline.Record(KubeProxyStopSent, n.Name())
	if err := f.Stop(ctx); err != nil {
		return fmt.Errorf("stop kube-proxy on %s: %w", n.Name(), err)
	}
	w.Timeline.Record(KubeProxyExited, n.Name())
	if err := w.Start(ctx, n); err != nil {
		return err
	}
	return w.WaitReady(ctx, n)
}

// StartProbe starts a probe on h whose events go to the timeline, and to each of
// observe. StopProbes stops client probes; servers (probe.Serve) keep running until
// Cleanup, across specs; reach probes (probe.Reach, see Reach) end on their own, and
// StopProbes leaves them alone, so that a scenario that stops its traffic never cuts
// a matrix short.
func (w *World) StartProbe(ctx context.Context, h topologies.Host, cfg probe.Config, observe ...func(probe.Event)) (*probe.Process, error) {
	tl := w.Timeline
	onEvent := tl.Add
	if len(observe) > 0 {
		onEvent = func(e probe.Event) {
			tl.Add(e)
			for _, o := range observe {
				o(e)
			}
		}
	}
	p, err := probe.Start(ctx, h, w.Probe, cfg, probe.Options{OnEvent: onEvent, Stderr: w.ProbeStderr})
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

// StopProbes stops every client probe gracefully (they flush their last events) and
// waits; the probes are retired (see Window).
// WaitVerdicts waits until every node's policy verdicts (PollVerdicts) have been
// reported through t. ctx bounds the wait.
func (w *World) WaitVerdicts(ctx context.Context, t monotime.Time) error {
	for {
		var short []string
		marks := w.Timeline.VerdictsReported()
		for _, n := range w.Topo.Nodes() {
			if marks[n.Name()] < t {
				short = append(short, n.Name())
			}
		}
		if len(short) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the policy verdicts of %s were not reported up to %v: %w", strings.Join(short, ", "), t, ctx.Err())
		case <-time.After(VerdictPoll / 5):
		}
	}
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
	w.Timeline.Record(HoldsReleased, "")
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
	win := w.Timeline.Window(start, end)
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
	w.mu.Unlock()
	errs := []error{w.StopProbes(ctx), stopAll(ctx, reaches), stopAll(ctx, servers)}
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

// VerdictPoll is how often PollVerdicts asks the driver for policy verdicts.
const VerdictPoll = 50 * time.Millisecond

// PollVerdicts asks the driver for every node's policy verdicts (the `events` verb)
// every VerdictPoll, and adds them to the timeline with the time up to which each
// node's are reported. The returned stop polls each node once more, so that every
// verdict up to the call is on the timeline, and returns the first error of any poll.
func (w *World) PollVerdicts(ctx context.Context) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	type poller struct {
		n      topologies.Node
		cursor string
		err    error
		done   chan struct{}
	}
	poll := func(p *poller) error {
		through := monotime.Now()
		evs, err := w.Driver.Events(context.WithoutCancel(ctx), NodeEnv(p.n), p.cursor)
		if err != nil {
			return fmt.Errorf("policy verdicts of %s: %w", p.n.Name(), err)
		}
		vs := make([]timeline.Verdict, len(evs.Events))
		for i, e := range evs.Events {
			vs[i] = timeline.Verdict{Time: monotime.Time(e.TimeNS), Node: p.n.Name(), Verdict: e.Verdict, Src: e.Src, Dst: e.Dst,
				Proto: e.Proto, Sport: e.Sport, Dport: e.Dport, Reason: e.Reason}
		}
		w.Timeline.AddVerdicts(p.n.Name(), through, vs)
		p.cursor = evs.Cursor
		return nil
	}
	var ps []*poller
	for _, n := range w.Topo.Nodes() {
		p := &poller{n: n, done: make(chan struct{})}
		ps = append(ps, p)
		go func() {
			defer close(p.done)
			for {
				if p.err = poll(p); p.err != nil {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(VerdictPoll):
				}
			}
		}()
	}
	return func() error {
		cancel()
		var errs []error
		for _, p := range ps {
			<-p.done
			if p.err == nil {
				p.err = poll(p)
			}
			errs = append(errs, p.err)
		}
		return errors.Join(errs...)
	}
}
