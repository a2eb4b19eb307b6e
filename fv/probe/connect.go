package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// connector is RoleConnect: a new TCP connection every interval.
type connector struct {
	cfg Connect
	em  *emitter

	mu       sync.Mutex
	inflight map[uint64]monotime.Time
	held     []heldConn // with Hold: the answered connections, still open
	released atomic.Bool
	made     atomic.Int64
}

// release stops holding the connections opened from now on, and says so.
func (c *connector) release() {
	if !c.cfg.Hold || c.released.Load() {
		return
	}
	c.em.emit(Event{Time: monotime.Now(), Kind: KindReleased, Target: c.cfg.Target})
	c.released.Store(true)
}

// heldConn is the open connection of an answered attempt (Connect.Hold).
type heldConn struct {
	conn net.Conn
	seq  uint64
	t0   monotime.Time
}

func newConnector(cfg Connect, em *emitter) *connector {
	return &connector{cfg: cfg, em: em, inflight: map[uint64]monotime.Time{}}
}

// mark is the start of the oldest attempt still in flight: every attempt that started
// before it has been reported.
func (c *connector) mark() monotime.Time {
	m := monotime.Now()
	c.mu.Lock()
	for _, t := range c.inflight {
		if t < m {
			m = t
		}
	}
	c.mu.Unlock()
	return m
}

func (c *connector) run(ctx context.Context) (int, error) {
	c.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleConnect, Probe: c.cfg.Name, PID: os.Getpid(), Target: c.cfg.Target})
	var wg sync.WaitGroup
	slots := make(chan struct{}, c.cfg.MaxInFlight)
	sched := newSchedule(c.cfg.Interval)
	defer sched.stop()
	for seq := uint64(1); c.cfg.Count == 0 || seq <= uint64(c.cfg.Count); seq++ {
		if !sched.wait(ctx) {
			break
		}
		// Whether to hold it is read before its start is stamped: an attempt that
		// started after the release's stamp may be held, never one before it unheld.
		hold := c.cfg.Hold && !c.released.Load()
		t0 := monotime.Now()
		select {
		case slots <- struct{}{}:
		default:
			c.em.emit(Event{Time: t0, Kind: KindAttempt, Seq: seq, Target: c.cfg.Target, Outcome: Skipped,
				Err: fmt.Sprintf("not attempted: %d attempts already in flight", c.cfg.MaxInFlight)})
			continue
		}
		c.mu.Lock()
		c.inflight[seq] = t0
		c.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := c.attempt(seq, t0, hold)
			c.made.Add(1)
			c.em.emit(ev)
			c.mu.Lock()
			delete(c.inflight, seq)
			c.mu.Unlock()
			<-slots
		}()
	}
	// In-flight attempts run to their own deadline: cutting them short on stop would
	// report timeouts that did not happen.
	wg.Wait()
	c.checkHeld()
	return int(c.made.Load()), nil
}

// attempt makes one connection and reports it; with hold, an answered one is kept.
func (c *connector) attempt(seq uint64, t0 monotime.Time, hold bool) Event {
	ev := Event{Time: t0, Kind: KindAttempt, Seq: seq, Target: c.cfg.Target}
	req := request{kind: reqConnect, from: c.cfg.Name, seq: seq, sent: t0, label: c.cfg.Label}
	if !hold {
		exchangeTCP(&ev, c.cfg.Target, req, c.cfg.Timeout)
		return ev
	}
	// A stream message: the server answers and keeps the connection.
	req.kind = reqStream
	if conn := openHeld(&ev, c.cfg.Target, req, c.cfg.Timeout); conn != nil {
		c.mu.Lock()
		c.held = append(c.held, heldConn{conn: conn, seq: seq, t0: t0})
		c.mu.Unlock()
	}
	return ev
}

// maxChecks bounds the held connections checked at once.
const maxChecks = 4096

// checkHeld sends a second request on every held connection, all at once (a
// dataplane that lost them all costs one Timeout, not one per connection), and
// reports each as a KindHeld event.
func (c *connector) checkHeld() {
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxChecks)
	for _, h := range held {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ev := Event{Time: h.t0, Kind: KindHeld, Seq: h.seq, Target: c.cfg.Target}
			t1 := monotime.Now()
			ev.End = t1
			// A connect request now: the server answers, then closes first.
			req := request{kind: reqConnect, from: c.cfg.Name, seq: h.seq, sent: t1, label: c.cfg.Label}
			finishHeld(&ev, h.conn, req, c.cfg.Timeout)
			c.em.emit(ev)
		})
	}
	wg.Wait()
}

// openHeld is exchangeTCP for a connection to hold: it connects, sends req, and
// returns the connection once answered (nil if it was not), ev set as
// exchangeTCP sets it.
func openHeld(ev *Event, addr string, req request, timeout time.Duration) net.Conn {
	t0 := req.sent
	deadline := t0.Add(timeout)
	d := net.Dialer{Deadline: deadline.Deadline(), KeepAlive: -1}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		failed(ev, t0, "connect", err)
		return nil
	}
	if err := exchange(ev, conn, req, timeout, deadline); err != nil {
		conn.Close()
		return nil
	}
	// Held silent: no deadline until it is checked.
	if err := conn.SetDeadline(time.Time{}); err != nil {
		failed(ev, t0, "hold", err)
		conn.Close()
		return nil
	}
	return conn
}

// finishHeld sends req on a held connection, judges its answer into ev (Latency
// from req.sent), waits for the server's FIN and closes it.
func finishHeld(ev *Event, conn net.Conn, req request, timeout time.Duration) {
	defer conn.Close()
	if err := exchange(ev, conn, req, timeout, req.sent.Add(timeout)); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, conn)
}

// exchange sends req on conn and reads its answer by deadline, setting ev's
// Outcome, Err, Latency and Backend; a non-nil error when it was not answered.
func exchange(ev *Event, conn net.Conn, req request, timeout time.Duration, deadline monotime.Time) error {
	t0 := req.sent
	if err := conn.SetDeadline(deadline.Deadline()); err != nil {
		failed(ev, t0, "send", err)
		return err
	}
	var buf [256]byte
	if _, err := conn.Write(req.append(buf[:0])); err != nil {
		failed(ev, t0, "send", err)
		return err
	}
	line, _, err := readLine(conn, buf[:])
	t1 := monotime.Now()
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			ev.Outcome, ev.Err, ev.Latency = WrongReply, fmt.Sprintf("reply: truncated %q", line), t1.Sub(t0)
			return err
		}
		failed(ev, t0, "reply", err)
		return err
	}
	if !judgeReply(ev, line, req, t1, timeout) {
		return errors.New(ev.Err)
	}
	return nil
}

// exchangeTCP makes one connection to addr: connect, send req, read the reply, then
// wait for the server's FIN so that the client is never the side left in TIME_WAIT.
// The attempt started at req.sent and has timeout from then to the reply. It sets ev's
// Outcome, Err, Latency and Backend, and returns the connection's local address (nil
// when it never connected).
func exchangeTCP(ev *Event, addr string, req request, timeout time.Duration) (local net.Addr) {
	t0 := req.sent
	deadline := t0.Add(timeout)
	fail := func(phase string, err error) { failed(ev, t0, phase, err) }
	d := net.Dialer{Deadline: deadline.Deadline(), KeepAlive: -1}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		fail("connect", err)
		return nil
	}
	defer conn.Close()
	local = conn.LocalAddr()
	if err := conn.SetDeadline(deadline.Deadline()); err != nil {
		fail("connect", err)
		return local
	}
	var buf [256]byte
	if _, err := conn.Write(req.append(buf[:0])); err != nil {
		fail("send", err)
		return local
	}
	line, rest, err := readLine(conn, buf[:])
	t1 := monotime.Now()
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			ev.Outcome, ev.Err, ev.Latency = WrongReply, fmt.Sprintf("reply: truncated %q", line), t1.Sub(t0)
			return local
		}
		fail("reply", err)
		return local
	}
	if !judgeReply(ev, line, req, t1, timeout) {
		return local
	}
	if !rest {
		// Wait for the FIN (usually already here, behind the reply).
		_, _ = io.Copy(io.Discard, conn)
	}
	return local
}

// failed sets ev's Outcome and Err from the error of phase, and its Latency from t0.
func failed(ev *Event, t0 monotime.Time, phase string, err error) {
	ev.Outcome, ev.Err = classify(phase, err)
	ev.Latency = monotime.Since(t0)
}

// judgeReply sets ev's Outcome, Latency and Backend (or Err) from the reply line to
// req received at t1: ok with the server's name, a timeout when it came later than
// timeout after req.sent, or a wrong reply. It reports whether the reply is the answer.
func judgeReply(ev *Event, line []byte, req request, t1 monotime.Time, timeout time.Duration) bool {
	ev.Latency = t1.Sub(req.sent)
	if ev.Latency > timeout {
		ev.Outcome, ev.Err = Timeout, fmt.Sprintf("reply: arrived after the %v timeout", timeout)
		return false
	}
	name, rseq, ok := parseReply(line)
	if !ok || rseq != req.seq {
		ev.Outcome, ev.Err = WrongReply, fmt.Sprintf("reply: %q is not the answer to request %d", line, req.seq)
		return false
	}
	ev.Outcome, ev.Backend = OK, name
	return true
}

// readLine reads one line (without its newline) into buf; rest reports whether the
// peer's EOF was read too.
func readLine(conn net.Conn, buf []byte) (line []byte, eof bool, err error) {
	n := 0
	for {
		if n == len(buf) {
			return buf[:n], false, fmt.Errorf("line longer than %d bytes", len(buf))
		}
		m, err := conn.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return buf[:i], err == io.EOF, nil
		}
		if err != nil {
			return buf[:n], err == io.EOF, err
		}
	}
}

// schedule paces a loop to absolute times start+k*interval. A loop that falls behind
// (the process was starved) skips the missed slots instead of bursting, so the gap
// shows on the timeline instead of being hidden by a flood.
//
// A schedule under preciseBelow waits in the kernel (monotime.SleepUntil), not on a
// Go timer: the runtime's timers keep about a millisecond, so a 250 µs schedule
// (order-interval) sent most of its slots 1.2 ms apart, two at a time (measured in
// ORDER-NEW-ENDPOINT: p50 257 µs, p90 1.24 ms, mean 445 µs), and a window of a
// millisecond or two could pass with no datagram in it.
type schedule struct {
	interval time.Duration
	next     monotime.Time
	timer    *time.Timer // nil under preciseBelow
}

func newSchedule(interval time.Duration) *schedule {
	s := &schedule{interval: interval, next: monotime.Now()}
	if interval >= preciseBelow {
		s.timer = time.NewTimer(time.Hour)
	}
	return s
}

// preciseBelow is the interval under which a schedule sleeps in the kernel.
const preciseBelow = time.Millisecond

// wait blocks until the next slot; false when ctx is done.
func (s *schedule) wait(ctx context.Context) bool {
	if d := monotime.Until(s.next); d > 0 && s.timer == nil {
		// At most an interval: ctx is checked before and after.
		if ctx.Err() != nil {
			return false
		}
		monotime.SleepUntil(s.next)
		if ctx.Err() != nil {
			return false
		}
	} else if d > 0 {
		s.timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-s.timer.C:
		}
	} else if ctx.Err() != nil {
		return false
	}
	s.next = s.next.Add(s.interval)
	if now := monotime.Now(); now.Sub(s.next) > s.interval {
		s.next = now
	}
	return true
}

func (s *schedule) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}
