package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
)

// TestEvents runs `events` against real pins: a datapath opened in a private
// bpffs (as the agent would, then gone), its endpoint programs on a veth in a
// network namespace of the test's own, and traffic from the "workload" side
// that egress policy judges.
func TestEvents(t *testing.T) {
	privileged.Require(t)
	if err := bpf.CheckKernel(); err != nil {
		t.Skipf("SKIPPED: kernel cannot run the datapath: %v", err)
	}
	bins, err := buildbin.Build(context.Background(), t.TempDir(), "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(bpffs, unix.MNT_DETACH) })
	state := t.TempDir()
	call := func(cursor string) (driver.Events, error) {
		t.Helper()
		cmd := exec.Command(bins["refdp-driver"], "events", "--cursor", cursor)
		cmd.Env = []string{"DPC_NODE=node-a", "DPC_KUBECONFIG=/nonexistent/kubeconfig", "DPC_STATE_DIR=" + state, "DPC_BPFFS=" + bpffs}
		out, err := cmd.Output()
		if err != nil {
			return driver.Events{}, errors.New(string(out))
		}
		var evs driver.Events
		if err := json.Unmarshal(out, &evs); err != nil || evs.Events == nil {
			t.Fatalf("events: %s is not {\"cursor\",\"events\"} (%v)", out, err)
		}
		return evs, nil
	}
	expect := func(what, cursor string, since monotime.Time, want ...driver.Event) string {
		t.Helper()
		evs, err := call(cursor)
		if err != nil {
			t.Fatalf("%s: events --cursor %q: %v", what, cursor, err)
		}
		until := monotime.Now()
		for i := range evs.Events {
			e := &evs.Events[i]
			if tm := monotime.Time(e.TimeNS); tm < since || tm > until {
				t.Errorf("%s: %+v stamped outside the call's window", what, e)
			}
			e.TimeNS = 0
		}
		if !equalEvents(evs.Events, want) {
			t.Errorf("%s: events %+v, want %+v", what, evs.Events, want)
		}
		return evs.Cursor
	}

	// No datapath on the node yet: nothing reported, and the cursor says so.
	cursor := expect("before the datapath", "", 0)
	if cursor != "0/0/0" {
		t.Errorf("cursor before the datapath %q, want 0/0/0", cursor)
	}

	enterNewNetns(t)
	pinDir := filepath.Join(bpffs, "refdp") // as the agent pins
	must(t, os.Mkdir(pinDir, 0o700))
	d, err := bpf.Open(pinDir, bpf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ep, workload := wireWorkload(t)
	must(t, d.AttachEndpointWithPolicy(ep, netip.MustParseAddr("10.244.0.5"), 0,
		bpf.EndpointPolicy{EgressIsolated: true, Egress: []bpf.PolicyRule{{Proto: bpf.UDP, PortMin: 53, PortMax: 53}}}))
	cursor = expect("the ring buffer pinned since", cursor, 0)

	// The pod's flow to port 53 is allowed, once; to 5353, each packet is
	// denied.
	t0 := monotime.Now()
	send(t, workload, 40000, 53, 2)
	send(t, workload, 40001, 5353, 2)
	reason := "egress policy of if" + strconv.Itoa(ep) + ": "
	cursor = expect("the pod's traffic", cursor, t0,
		driver.Event{Verdict: "allow", Src: "10.244.0.5", Dst: "10.244.0.9", Proto: "UDP", Sport: 40000, Dport: 53, Reason: reason + "rule matched"},
		driver.Event{Verdict: "deny", Src: "10.244.0.5", Dst: "10.244.0.9", Proto: "UDP", Sport: 40001, Dport: 5353, Reason: reason + "no rule matched"},
		driver.Event{Verdict: "deny", Src: "10.244.0.5", Dst: "10.244.0.9", Proto: "UDP", Sport: 40001, Dport: 5353, Reason: reason + "no rule matched"},
	)
	if !strings.HasSuffix(cursor, "/3/0") {
		t.Errorf("cursor %q, want 3 read, 0 lost", cursor)
	}
	// The agent is gone, the programs report on; a second call returns only
	// what is new.
	d.Close()
	cursor = expect("nothing new", cursor, 0)

	// Overflow the ring buffer with denied packets: the next call must not
	// pass the log off as complete.
	r, err := bpf.OpenVerdicts(pinDir)
	must(t, err)
	defer r.Close()
	for sent := 0; ; sent += 1000 {
		if lost, err := r.Lost(); err != nil || lost > 0 {
			must(t, err)
			break
		}
		if sent > 10*bpf.VerdictRingSize/32 {
			t.Fatalf("%d denied packets sent, no verdict lost", sent)
		}
		send(t, workload, 40002, 5353, 1000)
	}
	_, err = call(cursor)
	if err == nil || !strings.Contains(err.Error(), "verdicts lost") || !strings.Contains(err.Error(), bpf.VerdictsMapName) {
		t.Errorf("events after an overflow: %v, want a failure naming %s and the lost verdicts", err, bpf.VerdictsMapName)
	}
	// A first call takes the loss so far as its baseline.
	cursor = expect("a first call after the overflow", "", 0)
	expect("the call after it", cursor, 0)

	if _, err := call("1/2"); err == nil || !strings.Contains(err.Error(), "bad cursor") {
		t.Errorf("events --cursor 1/2: %v, want a bad cursor", err)
	}
}

func equalEvents(a, b []driver.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// enterNewNetns moves the test's goroutine, locked to its thread, into a new
// network namespace until the test ends.
func enterNewNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	must(t, err)
	h, err := netns.New()
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			return // leave the thread locked: the runtime retires it
		}
		h.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
}

// wireWorkload makes a veth pair: the endpoint's host side (returned first,
// its ifindex) and the workload's side, 10.244.0.5/24, which reaches
// 10.244.0.9 through it without ARP.
func wireWorkload(t *testing.T) (ep int, workload string) {
	t.Helper()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "dpc-ev0"}, PeerName: "dpc-ev1"}))
	host, err := netlink.LinkByName("dpc-ev0")
	must(t, err)
	wl, err := netlink.LinkByName("dpc-ev1")
	must(t, err)
	must(t, netlink.LinkSetUp(host))
	must(t, netlink.LinkSetUp(wl))
	must(t, netlink.AddrAdd(wl, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 244, 0, 5), Mask: net.CIDRMask(24, 32)}}))
	must(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: wl.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: net.IPv4(10, 244, 0, 9), HardwareAddr: host.Attrs().HardwareAddr}))
	return host.Attrs().Index, "10.244.0.5"
}

// send sends n UDP datagrams from the workload's sport to 10.244.0.9:dport.
func send(t *testing.T, from string, sport, dport, n int) {
	t.Helper()
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from), Port: sport}, &net.UDPAddr{IP: net.IPv4(10, 244, 0, 9), Port: dport})
	must(t, err)
	defer c.Close()
	for range n {
		if _, err := c.Write([]byte("verdict")); err != nil && !errors.Is(err, unix.ECONNREFUSED) {
			t.Fatal(err)
		}
	}
}
