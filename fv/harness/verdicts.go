package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
	"github.com/dpconform/dpconform/topologies"
)

// StopProbes stops every client probe gracefully (they flush their last events) and
// waits; the probes are retired (see Window).
// WaitVerdicts waits until every node's policy verdicts (PollVerdicts) have been
// reported through t. ctx bounds the wait.
func (w *World) WaitVerdicts(ctx context.Context, t monotime.Time) error {
	for {
		var short []string
		marks := w.Timeline().VerdictsReported()
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
			vs[i] = timeline.Verdict{Time: w.toSuite(p.n.Name(), monotime.Time(e.TimeNS)), Node: p.n.Name(), Verdict: e.Verdict, Src: e.Src, Dst: e.Dst,
				Proto: e.Proto, Sport: e.Sport, Dport: e.Dport, Reason: e.Reason}
		}
		w.Timeline().AddVerdicts(p.n.Name(), through, vs)
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
