package probe

import (
	"bytes"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// answerer is a UDP server on loopback that answers the line protocol as the serve
// role does, except as its test says: no answer, a late one, two, or one from another
// socket.
type answerer struct {
	c, other *net.UDPConn
	answer   func(seq uint64) (delay time.Duration, fromOther, twice, none bool)
}

func newAnswerer(t *testing.T, answer func(seq uint64) (time.Duration, bool, bool, bool)) *answerer {
	t.Helper()
	listen := func() *net.UDPConn {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a := &answerer{c: listen(), other: listen(), answer: answer}
	go a.serve()
	return a
}

func (a *answerer) serve() {
	buf := make([]byte, 2048)
	for {
		n, peer, err := a.c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		req, ok := parseRequest(buf[:n])
		if !ok {
			continue
		}
		delay, fromOther, twice, none := a.answer(req.seq)
		if none {
			continue
		}
		out := appendReply(nil, "srv", req.seq)
		from := a.c
		if fromOther {
			from = a.other
		}
		send := func() {
			_, _ = from.WriteToUDP(out, peer)
			if twice {
				_, _ = from.WriteToUDP(out, peer)
			}
		}
		if delay > 0 {
			time.AfterFunc(delay, send)
		} else {
			send()
		}
	}
}

// TestUDPReplies runs the udp role in-process with Replies against an answerer: each
// answer in time is reported once, with the server's name and the address it came
// from; missing and late answers are not; and a watermark never passes an event not
// yet written.
func TestUDPReplies(t *testing.T) {
	const count = 60
	a := newAnswerer(t, func(seq uint64) (time.Duration, bool, bool, bool) {
		switch {
		case seq%10 == 0:
			return 0, false, false, true // lost
		case seq%10 == 3:
			return 700 * time.Millisecond, false, false, false // later than the timeout
		case seq%10 == 5:
			return 0, true, false, false // from another address
		case seq%10 == 7:
			return 0, false, true, false // twice
		}
		return 0, false, false, false
	})
	dst := a.c.LocalAddr().String()
	var out bytes.Buffer
	args := []string{"udp", "-name", "c", "-to", "svc=" + dst, "-interval", "2ms", "-count", strconv.Itoa(count),
		"-replies", "-timeout", "500ms", "-report", "5ms"}
	done := make(chan int)
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { done <- run(args, pr, &out, io.Discard) }()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit code %d; output %s", code, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the udp probe did not end after its count")
	}

	d := NewDecoder(&out)
	sent := map[uint64]Event{}
	replies := map[uint64][]Event{}
	var written []Event
	for {
		e, err := d.Decode()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e.Kind {
		case KindSent:
			sent[e.Seq] = e
		case KindReply:
			replies[e.Seq] = append(replies[e.Seq], e)
		case KindMark:
			// Everything about a datagram sent before the mark is written already:
			// its sent event, and its reply unless the reply never comes in time.
			for seq, s := range sent {
				if s.Time >= e.Time || seq%10 == 0 || seq%10 == 3 {
					continue
				}
				if len(replies[seq]) == 0 {
					t.Errorf("mark at %d passed datagram #%d (sent %d) before its reply was written", e.Time, seq, s.Time)
				}
			}
		}
		written = append(written, e)
	}
	if len(sent) != count {
		t.Fatalf("%d datagrams sent, want %d", len(sent), count)
	}
	for seq := uint64(1); seq <= count; seq++ {
		rs := replies[seq]
		switch seq % 10 {
		case 0, 3:
			if len(rs) != 0 {
				t.Errorf("#%d: reported %v, want no answer (lost or late)", seq, rs)
			}
			continue
		}
		if len(rs) != 1 {
			t.Errorf("#%d: %d answers reported, want 1: %v", seq, len(rs), rs)
			continue
		}
		r := rs[0]
		if r.Time != sent[seq].Time || r.End < r.Time || r.Latency != r.End.Sub(r.Time) || r.Backend != "srv" || r.Target != "svc" {
			t.Errorf("#%d: reply %+v for sent %+v", seq, r, sent[seq])
		}
		wantOutcome, wantPeer := OK, dst
		if seq%10 == 5 {
			wantOutcome, wantPeer = WrongReply, a.other.LocalAddr().String()
		}
		if r.Outcome != wantOutcome || r.Peer != wantPeer {
			t.Errorf("#%d: outcome %s from %s (%s), want %s from %s", seq, r.Outcome, r.Peer, r.Err, wantOutcome, wantPeer)
		}
		if r.Outcome == WrongReply && !strings.Contains(r.Err, "not from the destination "+dst) {
			t.Errorf("#%d: err %q", seq, r.Err)
		}
	}
	if last := written[len(written)-1]; last.Kind != KindDone || last.Count != count {
		t.Errorf("last event %+v, want done with %d", last, count)
	}
}

func TestUDPRepliesNeedOneSocket(t *testing.T) {
	c := UDP{Name: "c", To: []Destination{{"S", "10.0.0.1:80"}}, NewSocket: true, Replies: true}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "new-socket") {
		t.Fatalf("Validate = %v, want an error about new-socket", err)
	}
}

// A serve probe's UDP socket gets its large receive buffer (as root), and the
// kernel's drop counter comes with each datagram: datagrams its full buffer dropped
// are counted, so the probe can report them as its own loss.
func TestReceiveQueueCountsDrops(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := receiveQueue(c); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		raw, _ := c.SyscallConn()
		var size int
		_ = raw.Control(func(fd uintptr) { size, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
		if err != nil || size < UDPReceiveBuffer {
			t.Fatalf("SO_RCVBUF is %d (%v), want at least %d", size, err, UDPReceiveBuffer)
		}
	}
	// Now a tiny buffer, overrun while nobody reads.
	if err := c.SetReadBuffer(1); err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp", nil, c.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for range 100 {
		if _, err := tx.Write(make([]byte, 512)); err != nil {
			t.Fatal(err)
		}
	}
	// Drain what the buffer held (queued before any drop: no count), then the first
	// datagram queued after the drops carries their count.
	buf, oob := make([]byte, 2048), make([]byte, unix.CmsgSpace(4))
	for {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, _, _, _, err := c.ReadMsgUDP(buf, oob); err != nil {
			break
		}
	}
	if _, err := tx.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, oobn, _, _, err := c.ReadMsgUDP(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	drops, counted := socketDrops(oob[:oobn])
	if !counted || drops == 0 {
		t.Fatalf("after 100 datagrams into a full buffer: drop counter %d (present: %v), want > 0", drops, counted)
	}
}

// TestUDPNewSocketPeer runs the udp role with NewSocket: each sent event names the
// local address its datagram left from, the one the receiver saw.
func TestUDPNewSocketPeer(t *testing.T) {
	const count = 30
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make(chan map[uint64]string, 1)
	go func() {
		from := map[uint64]string{}
		buf := make([]byte, 2048)
		for len(from) < count {
			_ = l.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, peer, err := l.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if req, ok := parseRequest(buf[:n]); ok {
				from[req.seq] = peer.String()
			}
		}
		seen <- from
	}()
	wait := runInProcess(t, "udp", "-name", "c", "-to", "svc="+l.LocalAddr().String(), "-interval", "1ms",
		"-count", strconv.Itoa(count), "-new-socket", "-report", "5ms")
	code, events := wait()
	if code != 0 {
		t.Fatalf("exit code %d; events %+v", code, events)
	}
	from := <-seen
	sent := 0
	for _, e := range events {
		if e.Kind != KindSent {
			continue
		}
		sent++
		if e.Peer == "" || e.Peer != from[e.Seq] {
			t.Errorf("datagram #%d: sent event names local address %q, the receiver saw %q", e.Seq, e.Peer, from[e.Seq])
		}
	}
	if sent != count {
		t.Errorf("%d sent events, want %d", sent, count)
	}
}
