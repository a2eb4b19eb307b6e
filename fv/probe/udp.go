package probe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// udpSender is RoleUDP: datagrams numbered by one sequence across all destinations,
// sent round-robin, so "sent after" is a comparison of sequence numbers.
type udpSender struct {
	cfg   UDP
	em    *emitter
	addrs []*net.UDPAddr
	dests []netip.AddrPort // addrs, for telling a reply's source

	// mu is held from a datagram's stamp to its KindSent event, and while a reply is
	// matched and reported, so that a watermark never passes an event not yet written.
	mu sync.Mutex
	// inflight holds, with Replies, the datagrams not answered yet by sequence number,
	// with their send stamps; mark prunes those whose Timeout has passed.
	inflight map[uint64]monotime.Time
}

func newUDPSender(cfg UDP, em *emitter) (*udpSender, error) {
	u := &udpSender{cfg: cfg, em: em, inflight: map[uint64]monotime.Time{}}
	for _, d := range cfg.To {
		a, err := net.ResolveUDPAddr("udp", d.Addr)
		if err != nil {
			return nil, fmt.Errorf("destination %s: %w", d, err)
		}
		u.addrs = append(u.addrs, a)
		ap := a.AddrPort()
		u.dests = append(u.dests, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	return u, nil
}

// mark is now, or with Replies the send stamp of the oldest datagram still waiting
// for its reply within Timeout: every datagram sent before it has been reported, and
// so has every reply to one (a reply later than Timeout is not reported).
func (u *udpSender) mark() monotime.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := monotime.Now()
	m := now
	for seq, t := range u.inflight {
		if now.Sub(t) > u.cfg.Timeout {
			delete(u.inflight, seq)
			continue
		}
		m = min(m, t)
	}
	return m
}

func (u *udpSender) run(ctx context.Context) (int, error) {
	var conn *net.UDPConn
	if !u.cfg.NewSocket {
		// Bound to no address, so it works before the namespace has one: the first
		// datagram possible is the first that leaves.
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return 0, fmt.Errorf("open udp socket: %w", err)
		}
		defer c.Close()
		conn = c
		// The serve role answers every datagram: report the answers, or drain them.
		go u.readReplies(c)
	}
	u.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleUDP, Probe: u.cfg.Name, PID: os.Getpid(), Count: len(u.addrs)})
	sched := newSchedule(u.cfg.Interval)
	defer sched.stop()
	var buf [256]byte
	sent := 0
	for seq := uint64(1); u.cfg.Count == 0 || seq <= uint64(u.cfg.Count); seq++ {
		if !sched.wait(ctx) {
			break
		}
		i := int((seq - 1) % uint64(len(u.addrs)))
		label := u.cfg.To[i].Label
		u.mu.Lock()
		t0 := monotime.Now()
		b := request{kind: reqUDP, from: u.cfg.Name, seq: seq, sent: t0, label: label}.append(buf[:0])
		if u.cfg.Replies {
			u.inflight[seq] = t0
		}
		ev := Event{Time: t0, Kind: KindSent, Seq: seq, Target: label, Outcome: OK}
		var err error
		if conn != nil {
			_, err = conn.WriteToUDP(b, u.addrs[i])
		} else {
			ev.Peer, err = sendOnce(u.addrs[i], b)
		}
		if err != nil {
			ev.Outcome, ev.Err = classify("send", err)
			delete(u.inflight, seq)
		} else {
			sent++
		}
		u.em.emit(ev)
		u.mu.Unlock()
	}
	if u.cfg.Replies {
		// As a connect probe lets its attempts run to their deadline: the replies to
		// the last datagrams are still on their way.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for u.mark(); u.waiting(); u.mark() {
			<-tick.C
		}
	}
	return sent, nil
}

// waiting reports whether a datagram still waits for its reply.
func (u *udpSender) waiting() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.inflight) > 0
}

// readReplies reads what comes back on the socket until it is closed and, with
// Replies, reports each answer to a datagram still waiting for one as a KindReply.
func (u *udpSender) readReplies(c *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil || !u.cfg.Replies {
			continue
		}
		t1 := monotime.Now()
		name, seq, ok := parseReply(buf[:n])
		if !ok || seq == 0 {
			continue // not an answer of the line protocol
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		u.mu.Lock()
		if t0, waiting := u.inflight[seq]; waiting {
			delete(u.inflight, seq)
			if t1.Sub(t0) <= u.cfg.Timeout {
				u.em.emit(u.reply(seq, t0, t1, name, from))
			}
		}
		u.mu.Unlock()
	}
}

// reply is the KindReply event of datagram seq, sent at t0 and answered at t1 by the
// server name from the address from.
func (u *udpSender) reply(seq uint64, t0, t1 monotime.Time, name string, from netip.AddrPort) Event {
	i := int((seq - 1) % uint64(len(u.addrs)))
	ev := Event{Time: t0, Kind: KindReply, Seq: seq, End: t1, Latency: t1.Sub(t0), Backend: name,
		Peer: from.String(), Target: u.cfg.To[i].Label, Outcome: OK}
	if from != u.dests[i] {
		// A client whose socket is connected to the destination would never see it.
		ev.Outcome, ev.Err = WrongReply, fmt.Sprintf("the reply came from %s, not from the destination %s", from, u.dests[i])
	}
	return ev
}

// sendOnce sends b to to from a new socket, and returns the socket's local address:
// the kernel picks its port, and may pick one an earlier socket used.
func sendOnce(to *net.UDPAddr, b []byte) (string, error) {
	c, err := net.DialUDP("udp", nil, to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_, err = c.Write(b)
	return c.LocalAddr().String(), err
}

// exchangeUDP sends req in one datagram from a new socket (a new flow for the
// dataplane) and waits for the answer until timeout after req.sent. The socket is
// connected, so an ICMP error in answer comes back as one (port unreachable: Refused),
// and a datagram from any other address is not taken for the answer. It sets ev's
// Outcome, Err, Latency and Backend, and returns the socket's local address (nil when
// it could not open one).
//
// Its source port is below the kernel's ephemeral range (reachPort): a reach
// probe's flow, answered, stays in the dataplane's conntrack some 30 s after it, and a
// later probe's new socket that the kernel gave the same port would be taken for it,
// let through as established where the policy now refuses a new flow.
func exchangeUDP(ev *Event, addr string, req request, timeout time.Duration) net.Addr {
	t0 := req.sent
	deadline := t0.Add(timeout).Deadline()
	var c net.Conn
	var err error
	for try := 0; ; try++ {
		d := net.Dialer{Deadline: deadline}
		if port := reachPort(); port != 0 {
			d.LocalAddr = &net.UDPAddr{Port: port}
		}
		c, err = d.Dial("udp", addr)
		// A port in use (by a server in this pod) is tried again with another.
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || try == 9 {
			break
		}
	}
	if err != nil {
		failed(ev, t0, "socket", err)
		return nil
	}
	defer c.Close()
	local := c.LocalAddr()
	if err := c.SetDeadline(deadline); err != nil {
		failed(ev, t0, "socket", err)
		return local
	}
	var buf [512]byte
	if _, err := c.Write(req.append(buf[:0])); err != nil {
		failed(ev, t0, "send", err)
		return local
	}
	n, err := c.Read(buf[:])
	if err != nil {
		failed(ev, t0, "reply", err)
		return local
	}
	judgeReply(ev, buf[:n], req, monotime.Now(), timeout)
	return local
}

// Reach probes' UDP source ports are drawn from [reachPortLow, the start of the
// ephemeral range): never a port the kernel hands a socket that binds none, as the
// UDP and connect probes' do.
const reachPortLow = 10000

// reachPort returns a random port below the ephemeral range of this network namespace,
// or 0 (any port) where that range leaves too little room below it.
func reachPort() int {
	lo := ephemeralLow()
	if lo < reachPortLow+1000 {
		return 0
	}
	return reachPortLow + rand.IntN(lo-reachPortLow)
}

// ephemeralLow is the start of this network namespace's ephemeral port range
// (net.ipv4.ip_local_port_range, 32768 unless set), or 0 where it cannot be read. A
// probe lives in one namespace, so it is read once, not for every datagram.
var ephemeralLow = sync.OnceValue(func() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
})
