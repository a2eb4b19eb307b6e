package probe

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// send says a write waited only when the send buffer had no room: that time is the
// path's, any other is the probe's own stall.
func TestSendSaysWhenItWaitedForRoom(t *testing.T) {
	conn, peer, rc := loopbackPair(t)
	if err := conn.SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}

	msg := make([]byte, 1024)
	if waited, err := send(rc, msg); err != nil || waited {
		t.Fatalf("first write to an empty buffer: waited %v, err %v; want no wait", waited, err)
	}
	// The peer reads nothing for a while: the buffers fill and a write must wait.
	const total = 4 << 20
	drained := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, err := io.CopyN(io.Discard, peer, total)
		drained <- err
	}()
	waits := 0
	for sent := len(msg); sent < total; sent += len(msg) {
		waited, err := send(rc, msg)
		if err != nil {
			t.Fatalf("write at %d bytes: %v", sent, err)
		}
		if waited {
			waits++
		}
	}
	if err := <-drained; err != nil {
		t.Fatalf("peer read: %v", err)
	}
	if waits == 0 {
		t.Fatalf("%d bytes to a peer that read nothing for 200 ms: no write waited for room", total)
	}
}

// A write to a socket the peer reset fails with the error classify calls a reset.
func TestSendReportsAReset(t *testing.T) {
	_, peer, rc := loopbackPair(t)
	if err := peer.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	peer.Close() // linger 0: a RST
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := send(rc, []byte("x\n"))
		if err != nil {
			if o, why := classify("send", err); o != Reset {
				t.Fatalf("write after the peer's RST: %v, classified %s (%s); want %s", err, o, why, Reset)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes after the peer's RST kept succeeding for 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// loopbackPair is a TCP connection over loopback, both ends closed at the test's end,
// with the raw connection of the dialling end.
func loopbackPair(t *testing.T) (conn, peer *net.TCPConn, rc syscall.RawConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	conn, peer = c.(*net.TCPConn), p.(*net.TCPConn)
	if rc, err = conn.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	return conn, peer, rc
}
