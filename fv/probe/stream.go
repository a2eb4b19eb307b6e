package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/fv/monotime"
)

// streamer is RoleStream: long-lived TCP connections exchanging a message every
// interval. Gaps are measured between the arrival times of consecutive echoes.
type streamer struct {
	cfg     Stream
	em      *emitter
	streams []*stream

	flushMu sync.Mutex
}

type stream struct {
	id int

	mu       sync.Mutex
	conn     net.Conn
	ended    bool
	backend  string
	expect   uint64        // next sequence number expected back
	last     monotime.Time // arrival of the last echo
	total    int
	n        int // echoes in this report period
	first    monotime.Time
	lastSeq  uint64
	maxGap   time.Duration
	maxGapAt monotime.Time
	maxLat   time.Duration
}

func newStreamer(cfg Stream, em *emitter) *streamer {
	s := &streamer{cfg: cfg, em: em}
	for i := 1; i <= cfg.Streams; i++ {
		s.streams = append(s.streams, &stream{id: i, expect: 1})
	}
	return s
}

// mark flushes the echo summaries: every echo that arrived before the mark has been
// reported.
func (s *streamer) mark() monotime.Time { return s.flush() }

func (s *streamer) flush() monotime.Time {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	var now monotime.Time
	for _, st := range s.streams {
		st.mu.Lock()
		now = monotime.Now() // under the lock: no echo stamped before it is left behind
		if st.n > 0 {
			s.em.emit(Event{Time: st.first, End: st.last, Kind: KindEcho, Stream: st.id, Count: st.n, Seq: st.lastSeq,
				Gap: st.maxGap, GapAt: st.maxGapAt, Latency: st.maxLat, Backend: st.backend, Target: s.cfg.Target})
			st.n, st.maxGap, st.maxGapAt, st.maxLat = 0, 0, 0, 0
		}
		st.mu.Unlock()
	}
	if now == 0 {
		now = monotime.Now()
	}
	return now
}

func (s *streamer) run(ctx context.Context) (int, error) {
	// Open every stream first, so that "ready" means the streams are up.
	var wg sync.WaitGroup
	for _, st := range s.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.open(st)
		}()
	}
	wg.Wait()
	s.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleStream, Probe: s.cfg.Name, PID: os.Getpid(), Target: s.cfg.Target, Count: len(s.streams)})
	for _, st := range s.streams {
		if st.conn == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.work(ctx, st)
		}()
	}
	wg.Wait()
	// Streams that all died leave the probe running: it keeps reporting (its
	// watermarks say "nothing more arrived") until it is stopped.
	<-ctx.Done()
	s.flush()
	total := 0
	for _, st := range s.streams {
		total += st.total
	}
	return total, nil
}

func (s *streamer) open(st *stream) {
	t0 := monotime.Now()
	d := net.Dialer{Timeout: s.cfg.DialTimeout, Control: promptRetransmissions}
	conn, err := d.Dial("tcp", s.cfg.Target)
	ev := Event{Time: t0, Kind: KindOpen, Stream: st.id, Target: s.cfg.Target, Latency: monotime.Since(t0), Outcome: OK}
	if err != nil {
		ev.Outcome, ev.Err = classify("connect", err)
	} else {
		st.conn = conn
		st.last = monotime.Now()
	}
	s.em.emit(ev)
}

// work runs one stream until ctx is done or the stream fails.
func (s *streamer) work(ctx context.Context, st *stream) {
	var eofAt atomic.Int64 // set by the reader when the peer's FIN arrives
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.read(st, &eofAt)
	}()
	// The watchdog lives as long as the writer, not the reader: after the peer's FIN
	// the reader is done, but the writer goes on, and on a path that drops its
	// packets (no RST ever comes back) it blocks on a full send buffer.
	writerDone := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			// Unblocks a write stuck on a full send buffer.
			_ = st.conn.SetWriteDeadline(time.Unix(1, 0))
		case <-writerDone:
		}
	}()
	defer func() {
		close(writerDone)
		s.end(st, Stopped, "probe stopped") // a no-op when the stream failed before
		st.conn.Close()
		<-readerDone
	}()

	rc, err := st.conn.(syscall.Conn).SyscallConn()
	if err != nil {
		s.end(st, LocalError, "send: "+err.Error())
		return
	}
	var buf [256]byte
	sched := newSchedule(s.cfg.Interval)
	defer sched.stop()
	var room monotime.Time // when the last write that waited for room in the send buffer got it
	for seq := uint64(1); ; seq++ {
		due := sched.next
		if !sched.wait(ctx) || s.isEnded(st) {
			return
		}
		t0 := monotime.Now()
		// Late from the slot, or from the end of a write that waited past it for room.
		if late := t0.Sub(max(due, room)); late > s.cfg.GapThreshold {
			s.em.emit(Event{Time: max(due, room), End: t0, Kind: KindStall, Stream: st.id, Gap: late, Target: s.cfg.Target})
		}
		req := request{kind: reqStream, from: s.cfg.Name, seq: seq, sent: t0, label: s.cfg.Label}.append(buf[:0])
		waited, err := send(rc, req)
		if waited {
			room = monotime.Now()
		}
		fin := monotime.Time(eofAt.Load())
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			o, why := classify("send", err)
			if fin != 0 {
				why = fmt.Sprintf("%s, %.1f ms after the peer's FIN", why, float64(t0-fin)/1e6)
			}
			s.end(st, o, why)
			return
		}
		if fin != 0 && t0.Sub(fin) > time.Second {
			s.end(st, Closed, "closed by the peer (FIN), and no RST followed within 1s")
			return
		}
	}
}

// send writes b to the socket and says whether it had to wait for room in the
// socket's send buffer, which a path that drops everything fills: that time is the
// path's. Any other time between the slot and the next one is the probe's own (the
// process stopped, or not scheduled, after the write returned), so the writer does
// not take a slow write's end as its reference, which would hide such a stall.
func send(rc syscall.RawConn, b []byte) (waited bool, err error) {
	werr := rc.Write(func(fd uintptr) bool {
		for len(b) > 0 {
			n, err2 := unix.Write(int(fd), b)
			switch {
			case errors.Is(err2, unix.EAGAIN):
				waited = true
				return false // the runtime's poller waits until the socket is writable
			case errors.Is(err2, unix.EINTR):
				continue
			case err2 != nil:
				err = os.NewSyscallError("write", err2)
				return true
			}
			b = b[n:]
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return waited, err
}

// read consumes echoes. After the peer's FIN it returns and leaves the writer to find
// out whether the peer's socket is gone (the next write draws a RST) or only closed.
func (s *streamer) read(st *stream, eofAt *atomic.Int64) {
	br := bufio.NewReaderSize(st.conn, 4096)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if s.isEnded(st) {
				return
			}
			if o, why := classify("receive", err); o == NoReply {
				eofAt.Store(int64(monotime.Now()))
			} else {
				s.end(st, o, why)
			}
			return
		}
		name, seq, ok := parseReply(line[:len(line)-1])
		st.mu.Lock()
		now := monotime.Now()
		switch {
		case !ok:
			st.mu.Unlock()
			s.end(st, WrongReply, fmt.Sprintf("receive: %q is not an echo", line))
			return
		case seq != st.expect:
			st.mu.Unlock()
			s.end(st, WrongReply, fmt.Sprintf("receive: echo of message %d where %d was due", seq, st.expect))
			return
		case st.backend != "" && name != st.backend:
			st.mu.Unlock()
			s.end(st, WrongReply, fmt.Sprintf("receive: echo from %s on a stream that %s answered", name, st.backend))
			return
		}
		st.expect++
		st.backend = name
		gap := now.Sub(st.last)
		if st.total == 0 {
			gap = 0 // from the handshake to the first echo is not a gap
		}
		gapAt := st.last
		if gap > st.maxGap {
			st.maxGap, st.maxGapAt = gap, gapAt
		}
		if st.n == 0 {
			st.first = now
		}
		st.n++
		st.total++
		st.last = now
		st.lastSeq = seq
		st.mu.Unlock()
		if gap > s.cfg.GapThreshold {
			s.em.emit(Event{Time: gapAt, End: now, Kind: KindGap, Stream: st.id, Gap: gap, Seq: seq, Backend: name, Target: s.cfg.Target})
		}
	}
}

func (s *streamer) isEnded(st *stream) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ended
}

// end reports the end of a stream once; the echoes before it are flushed first so
// that the stream's last echo precedes its end on the timeline.
func (s *streamer) end(st *stream, o Outcome, why string) {
	st.mu.Lock()
	if st.ended {
		st.mu.Unlock()
		return
	}
	st.ended = true
	backend := st.backend
	st.mu.Unlock()
	t := monotime.Now()
	s.flush()
	s.em.emit(Event{Time: t, Kind: KindEnd, Stream: st.id, Outcome: o, Err: why, Target: s.cfg.Target, Backend: backend})
}

// MaxRetransmitInterval is the longest a stream's socket waits between two
// retransmissions of an unacknowledged segment (TCP_RTO_MAX_MS, Linux 6.15 and later).
const MaxRetransmitInterval = time.Second

// promptRetransmissions caps, before a stream's socket connects, the interval between
// its retransmissions at MaxRetransmitInterval. A stream whose path is gone learns
// what the dataplane does about it only from the answer to its next packet: a
// dataplane that resets the flows to a vanished backend resets one when its next
// retransmission comes by. With the kernel's exponential backoff those come 0.2, 0.6,
// 1.4, 3.0 and 6.2 s after the path went, so the reset would show up to 3.2 s after
// the dataplane acted, by when the path went and not by what the dataplane did
// (SVC-ENDPOINT-VANISH allows 2 s from the Service's update). On a kernel without the
// option (ENOPROTOOPT) the stream keeps the kernel's backoff.
func promptRetransmissions(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_RTO_MAX_MS, int(MaxRetransmitInterval.Milliseconds()))
	}); cerr != nil {
		return cerr
	}
	if err != nil && !errors.Is(err, unix.ENOPROTOOPT) {
		return fmt.Errorf("setsockopt TCP_RTO_MAX_MS %d: %w", MaxRetransmitInterval.Milliseconds(), err)
	}
	return nil
}
