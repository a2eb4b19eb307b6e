package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// udpSender is RoleUDP: datagrams numbered by one sequence across all destinations,
// sent round-robin, so "sent after" is a comparison of sequence numbers.
type udpSender struct {
	cfg   UDP
	em    *emitter
	addrs []*net.UDPAddr
}

func newUDPSender(cfg UDP, em *emitter) (*udpSender, error) {
	u := &udpSender{cfg: cfg, em: em}
	for _, d := range cfg.To {
		a, err := net.ResolveUDPAddr("udp", d.Addr)
		if err != nil {
			return nil, fmt.Errorf("destination %s: %w", d, err)
		}
		u.addrs = append(u.addrs, a)
	}
	return u, nil
}

func (u *udpSender) mark() monotime.Time { return monotime.Now() }

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
		// Replies (the serve role answers every datagram) are not needed; drain them.
		go func() {
			buf := make([]byte, 2048)
			for {
				if _, _, err := c.ReadFromUDP(buf); errors.Is(err, net.ErrClosed) {
					return
				}
			}
		}()
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
		t0 := monotime.Now()
		label := u.cfg.To[i].Label
		b := request{kind: reqUDP, from: u.cfg.Name, seq: seq, sent: t0, label: label}.append(buf[:0])
		var err error
		if conn != nil {
			_, err = conn.WriteToUDP(b, u.addrs[i])
		} else {
			err = sendOnce(u.addrs[i], b)
		}
		ev := Event{Time: t0, Kind: KindSent, Seq: seq, Target: label, Outcome: OK}
		if err != nil {
			ev.Outcome, ev.Err = classify("send", err)
		} else {
			sent++
		}
		u.em.emit(ev)
	}
	return sent, nil
}

func sendOnce(to *net.UDPAddr, b []byte) error {
	c, err := net.DialUDP("udp", nil, to)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write(b)
	return err
}

// exchangeUDP sends req in one datagram from a new socket (a new flow for the
// dataplane) and waits for the answer until timeout after req.sent. The socket is
// connected, so an ICMP error in answer comes back as one (port unreachable: Refused),
// and a datagram from any other address is not taken for the answer. It sets ev's
// Outcome, Err, Latency and Backend, and returns the socket's local address (nil when
// it could not open one).
func exchangeUDP(ev *Event, addr string, req request, timeout time.Duration) net.Addr {
	t0 := req.sent
	deadline := t0.Add(timeout).Deadline()
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("udp", addr)
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
