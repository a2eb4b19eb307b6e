package probe

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/dpconform/dpconform/fv/monotime"
)

// reacher is RoleReach: every target once, at most ReachParallel at a time, one
// KindReach event each, then done.
type reacher struct {
	cfg   Reach
	em    *emitter
	start monotime.Time
	left  atomic.Int64 // targets not reported yet
}

func newReacher(cfg Reach, em *emitter) *reacher {
	r := &reacher{cfg: cfg, em: em, start: monotime.Now()}
	r.left.Store(int64(len(cfg.Targets)))
	return r
}

// mark holds at the start until every target is reported: a reach probe lives a few
// timeouts, and a watermark that never runs ahead is all a waiter needs.
func (r *reacher) mark() monotime.Time {
	if r.left.Load() > 0 {
		return r.start
	}
	return monotime.Now()
}

func (r *reacher) run(ctx context.Context) (int, error) {
	r.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleReach, Probe: r.cfg.Name, PID: os.Getpid(), Count: len(r.cfg.Targets)})
	slots := make(chan struct{}, ReachParallel)
	var wg sync.WaitGroup
	for i, t := range r.cfg.Targets {
		seq := uint64(i + 1)
		if !acquire(ctx, slots) {
			// Stopped: a target not tried is reported as such, never left out.
			r.report(Event{Time: monotime.Now(), Kind: KindReach, Seq: seq, Label: t.Label, Target: t.Addr, Proto: t.Proto,
				Outcome: Skipped, Err: "not attempted: the probe was stopped"})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.report(r.reach(ctx, seq, t))
			<-slots
		}()
	}
	// Tries in flight run to their own deadline, as a connect probe's do.
	wg.Wait()
	return len(r.cfg.Targets), nil
}

func acquire(ctx context.Context, slots chan struct{}) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *reacher) report(ev Event) {
	r.em.emit(ev)
	r.left.Add(-1)
}

// reach tries target t: one TCP connection, or UDP datagrams from new sockets until
// one is answered (only a timeout is tried again), Tries at most.
func (r *reacher) reach(ctx context.Context, seq uint64, t Target) Event {
	for n := 1; ; n++ {
		t0 := monotime.Now()
		ev := Event{Time: t0, Kind: KindReach, Seq: seq, Label: t.Label, Target: t.Addr, Proto: t.Proto, Count: n}
		req := request{from: r.cfg.Name, seq: seq, sent: t0, label: t.Label}
		var local net.Addr
		if t.Proto == "tcp" {
			req.kind = reqConnect
			local = exchangeTCP(&ev, t.Addr, req, r.cfg.Timeout)
		} else {
			req.kind = reqUDP
			local = exchangeUDP(&ev, t.Addr, req, r.cfg.Timeout)
		}
		if local != nil {
			ev.Peer = local.String()
		}
		if t.Proto == "tcp" || ev.Outcome != Timeout || n >= r.cfg.Tries || ctx.Err() != nil {
			return ev
		}
	}
}
