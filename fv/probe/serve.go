package probe

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/fv/monotime"
)

// server is RoleServe: TCP and UDP echo servers that answer with their name.
type server struct {
	cfg      Serve
	em       *emitter
	requests atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newServer(cfg Serve, em *emitter) *server {
	return &server{cfg: cfg, em: em, conns: map[net.Conn]struct{}{}}
}

func (s *server) mark() monotime.Time { return monotime.Now() }

func (s *server) run(ctx context.Context) (int, error) {
	var tcp []net.Listener
	var udp []*net.UDPConn
	closeAll := func() {
		for _, l := range tcp {
			l.Close()
		}
		for _, c := range udp {
			c.Close()
		}
	}
	for _, p := range s.cfg.TCP {
		l, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Address, strconv.Itoa(p)))
		if err != nil {
			closeAll()
			return 0, fmt.Errorf("listen tcp port %d: %w", p, err)
		}
		tcp = append(tcp, l)
	}
	for _, p := range s.cfg.UDP {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(s.cfg.Address), Port: p})
		if err != nil {
			closeAll()
			return 0, fmt.Errorf("listen udp port %d: %w", p, err)
		}
		udp = append(udp, c)
		if err := receiveQueue(c); err != nil {
			closeAll()
			return 0, fmt.Errorf("udp port %d: %w", p, err)
		}
	}
	s.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleServe, Probe: s.cfg.Name, PID: os.Getpid()})

	var wg sync.WaitGroup
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	defer stopHeartbeat()
	wg.Go(func() { s.heartbeat(hbCtx) })
	errs := make(chan error, len(tcp)+len(udp))
	for _, l := range tcp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.acceptLoop(ctx, l, &wg)
		}()
	}
	for _, c := range udp {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.udpLoop(ctx, c)
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	stopHeartbeat()
	closeAll()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	wg.Wait()
	return int(s.requests.Load()), err
}

// ServerStallThreshold is how late the echo server's heartbeat must wake to report
// a KindServerStall; ServerHeartbeat is its period.
const (
	ServerStallThreshold = DefaultGapThreshold
	ServerHeartbeat      = 5 * time.Millisecond
)

// heartbeat reports the times the server itself did not run: a stream's client
// measures its own lateness to send, but an echo is late as well when the server
// that answers it was not scheduled, and the stream's gap is then the instrument's,
// not the path's. A goroutine woken on a schedule is late when the process is
// (stopped, starved of CPU, or held by the runtime), as the echoing goroutines are.
func (s *server) heartbeat(ctx context.Context) {
	sched := newSchedule(ServerHeartbeat)
	defer sched.stop()
	for {
		due := sched.next
		if !sched.wait(ctx) {
			return
		}
		if now := monotime.Now(); now.Sub(due) > ServerStallThreshold {
			s.em.emit(Event{Time: due, End: now, Kind: KindServerStall, Gap: now.Sub(due)})
		}
	}
}

func (s *server) acceptLoop(ctx context.Context, l net.Listener, wg *sync.WaitGroup) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// EMFILE and friends are transient: report, keep serving.
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept on %s: %w", l.Addr(), err)
			}
			s.em.emit(Event{Time: monotime.Now(), Kind: KindError, Err: fmt.Sprintf("accept on %s: %v", l.Addr(), err)})
			time.Sleep(10 * time.Millisecond) // out of file descriptors: do not spin
			continue
		}
		s.mu.Lock()
		if ctx.Err() != nil {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

func (s *server) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 512)
	var out []byte
	first := true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		t1 := monotime.Now()
		req, ok := parseRequest(line)
		out = out[:0]
		if !ok {
			out = append(append(out, s.cfg.Name...), '\n')
		} else {
			s.requests.Add(1)
			out = appendReply(out, s.cfg.Name, req.seq)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		if !ok {
			continue
		}
		if s.cfg.RecordTCP && (req.kind == reqConnect || first) {
			s.em.emit(Event{Time: req.sent, Kind: KindRecv, Proto: "tcp", Seq: req.seq, From: req.from,
				Target: req.label, End: t1, Peer: c.RemoteAddr().String(), Backend: s.cfg.Name})
		}
		first = false
		if req.kind == reqConnect {
			// Close first: TIME_WAIT stays here, and the client's port is free at once.
			return
		}
	}
}

// UDPReceiveBuffer is a serve probe's UDP receive buffer. The kernel's default
// (net.core.rmem_default, 212,992 bytes) holds about 200 small datagrams: at the
// order-interval's 250 µs, four senders fill it in 25 ms of the probe not reading,
// and a clean run then lost datagrams in the instrument (measured on 2026-12-03).
// 8 MiB holds about a second of that.
const UDPReceiveBuffer = 8 << 20

// receiveQueue sizes c's receive buffer (SO_RCVBUFFORCE as root, else as far as
// net.core.rmem_max allows) and asks the kernel for its drop counter with each
// datagram (SO_RXQ_OVFL), so that what the probe's own socket drops is reported as
// the instrument's fault, never taken for the path's.
func receiveQueue(c *net.UDPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var forced, ovfl error
	if err := raw.Control(func(fd uintptr) {
		forced = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, UDPReceiveBuffer)
		ovfl = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
	}); err != nil {
		return err
	}
	if forced != nil {
		if err := c.SetReadBuffer(UDPReceiveBuffer); err != nil {
			return fmt.Errorf("receive buffer: %w", err)
		}
	}
	if ovfl != nil {
		return fmt.Errorf("SO_RXQ_OVFL: %w", ovfl)
	}
	return nil
}

// socketDrops returns the drop counter SO_RXQ_OVFL put in a datagram's control
// message, and whether there was one.
func socketDrops(oob []byte) (uint32, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_RXQ_OVFL && len(m.Data) >= 4 {
			return binary.NativeEndian.Uint32(m.Data), true
		}
	}
	return 0, false
}

func (s *server) udpLoop(ctx context.Context, c *net.UDPConn) error {
	buf := make([]byte, 2048)
	oob := make([]byte, unix.CmsgSpace(4))
	var out []byte
	var dropped uint32
	for {
		n, oobn, _, peer, err := c.ReadMsgUDP(buf, oob)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("read udp on %s: %w", c.LocalAddr(), err)
			}
			continue
		}
		t1 := monotime.Now()
		if d, ok := socketDrops(oob[:oobn]); ok && d != dropped {
			s.em.emit(Event{Time: t1, Kind: KindError, Err: fmt.Sprintf("udp %s: %d datagrams dropped by the probe's own socket "+
				"(receive buffer full) before this one: the instrument lost them, not the path", c.LocalAddr(), d-dropped)})
			dropped = d
		}
		req, ok := parseRequest(buf[:n])
		out = out[:0]
		if !ok {
			out = append(append(out, s.cfg.Name...), '\n')
		} else {
			s.requests.Add(1)
			s.em.emit(Event{Time: req.sent, Kind: KindRecv, Proto: "udp", Seq: req.seq, From: req.from,
				Target: req.label, End: t1, Peer: peer.String(), Backend: s.cfg.Name})
			out = appendReply(out, s.cfg.Name, req.seq)
		}
		// A reply that cannot be sent (no route back yet) is not the server's failure.
		_, _ = c.WriteToUDP(out, peer)
	}
}
