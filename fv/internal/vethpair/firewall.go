package vethpair

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/fv/monotime"
)

// IPTablesRestore is the iptables-restore the firewall drives (nf_tables backend).
var IPTablesRestore = "/usr/sbin/iptables-restore"

// Firewall changes the filter table of one namespace through a long-running
// "iptables-restore --noflush", one transaction per Apply, and times each change by
// the kernel's own notification of the new ruleset generation. Starting iptables for
// every change would add tens of milliseconds of process start-up to each edge of a
// blackhole.
type Firewall struct {
	side   Side
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr lockedBuffer
	mon    int // netlink socket subscribed to nf_tables notifications
}

// Applied is when a ruleset change was sent and when the kernel had committed it.
type Applied struct {
	Sent, Committed monotime.Time
}

// Firewall starts a firewall for the side.
func (s Side) Firewall() (_ *Firewall, err error) {
	f := &Firewall{side: s, mon: -1}
	h, err := ns.GetNS(s.Path)
	if err != nil {
		return nil, fmt.Errorf("firewall: open netns %s: %w", s.NS, err)
	}
	defer h.Close()
	// The notification socket belongs to the namespace it is created in.
	if err := h.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		f.mon = fd
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}); err != nil {
			return fmt.Errorf("subscribe to nf_tables notifications: %w", err)
		}
		return nil
	}); err != nil {
		f.Close()
		return nil, fmt.Errorf("firewall in %s: %w", s.NS, err)
	}
	f.cmd = exec.Command(IPTablesRestore, "--noflush")
	f.cmd.Stderr = &f.stderr
	if f.stdin, err = f.cmd.StdinPipe(); err != nil {
		f.Close()
		return nil, fmt.Errorf("firewall: %w", err)
	}
	if err := s.Starter().Start(f.cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("firewall: start %s: %w", IPTablesRestore, err)
	}
	return f, nil
}

// Apply commits rules (iptables-restore lines such as "-I INPUT -p tcp --dport 80 -j
// DROP") to the filter table in one transaction and returns once the kernel has
// committed it.
func (f *Firewall) Apply(ctx context.Context, rules ...string) (Applied, error) {
	if err := f.drain(); err != nil {
		return Applied{}, err
	}
	tx := "*filter\n" + strings.Join(rules, "\n") + "\nCOMMIT\n"
	sent := monotime.Now()
	if _, err := io.WriteString(f.stdin, tx); err != nil {
		return Applied{}, fmt.Errorf("firewall in %s: write %q: %w; stderr: %s", f.side.NS, rules, err, f.stderr.String())
	}
	committed, err := f.waitGeneration(ctx)
	if err != nil {
		return Applied{}, fmt.Errorf("firewall in %s: apply %q: %w; iptables-restore stderr: %s", f.side.NS, rules, err, f.stderr.String())
	}
	return Applied{Sent: sent, Committed: committed}, nil
}

// drain discards notifications of earlier transactions.
func (f *Firewall) drain() error {
	buf := make([]byte, 64*1024)
	for {
		_, _, err := unix.Recvfrom(f.mon, buf, 0)
		if errors.Is(err, unix.EAGAIN) {
			return nil
		}
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			return fmt.Errorf("firewall: drain notifications: %w", err)
		}
	}
}

// waitGeneration waits for NFT_MSG_NEWGEN, which closes every committed transaction.
func (f *Firewall) waitGeneration(ctx context.Context) (monotime.Time, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	newGen := uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)
	buf := make([]byte, 64*1024)
	for {
		wait := time.Until(deadline)
		if wait <= 0 {
			return 0, errors.New("no commit notification before the deadline")
		}
		fds := []unix.PollFd{{Fd: int32(f.mon), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(wait/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, fmt.Errorf("poll: %w", err)
		}
		for {
			n, _, err := unix.Recvfrom(f.mon, buf, 0)
			if errors.Is(err, unix.EAGAIN) {
				break
			}
			t := monotime.Now()
			if err != nil {
				return 0, fmt.Errorf("read notifications: %w", err)
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				return 0, fmt.Errorf("parse notification: %w", err)
			}
			for _, m := range msgs {
				if m.Header.Type == newGen {
					return t, nil
				}
			}
		}
	}
}

// Close stops iptables-restore (leaving the rules as they are) and releases the
// notification socket.
func (f *Firewall) Close() error {
	var errs []error
	if f.stdin != nil {
		f.stdin.Close()
	}
	if f.cmd != nil && f.cmd.Process != nil {
		done := make(chan error, 1)
		go func() { done <- f.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, fmt.Errorf("iptables-restore: %w; stderr: %s", err, f.stderr.String()))
			}
		case <-time.After(5 * time.Second):
			_ = f.cmd.Process.Kill()
			<-done
			errs = append(errs, errors.New("iptables-restore did not exit; killed"))
		}
	}
	if f.mon >= 0 {
		unix.Close(f.mon)
		f.mon = -1
	}
	return errors.Join(errs...)
}

// lockedBuffer is a bytes.Buffer that exec's copying goroutine and the caller can share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.TrimSpace(l.b.String())
}
