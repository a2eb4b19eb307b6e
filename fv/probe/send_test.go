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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	peer.Close() // linger 0: a RST
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
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
