package harness

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

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
	w.Timeline().Record(timeline.StartSent, detail)
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
	w.Timeline().Record(timeline.StopSent, n.Name())
	if err := w.Driver.Stop(ctx, NodeEnv(n)); err != nil {
		return err
	}
	w.Timeline().Record(timeline.Exited, n.Name())
	return nil
}

// Kill crashes the agent on n, recording kill-sent and exited.
func (w *World) Kill(ctx context.Context, n topologies.Node) error {
	w.Timeline().Record(timeline.KillSent, n.Name())
	if err := w.Driver.Kill(ctx, NodeEnv(n)); err != nil {
		return err
	}
	w.Timeline().Record(timeline.Exited, n.Name())
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
				since := int64(w.toSuite(n.Name(), monotime.Time(st.ReadySinceNS))) // the node's clock
				w.Timeline().RecordAt(readyAt(asked, monotime.Now(), since), timeline.Ready, n.Name())
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
	w.Timeline().Record(KubeProxyStopSent, n.Name())
	if err := f.Stop(ctx); err != nil {
		return fmt.Errorf("stop kube-proxy on %s: %w", n.Name(), err)
	}
	w.Timeline().Record(KubeProxyExited, n.Name())
	if err := w.Start(ctx, n); err != nil {
		return err
	}
	return w.WaitReady(ctx, n)
}
