package probe

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestReachArgsRoundTrip(t *testing.T) {
	for _, c := range []Reach{
		{Name: "reach-x-a-1", Targets: []Target{
			{Label: "y/b TCP/80", Proto: "tcp", Addr: "10.0.0.2:80"},
			{Label: "y/b UDP/81", Proto: "udp", Addr: "10.0.0.2:81"},
			{Label: "commas, and 100% = odd", Proto: "tcp", Addr: "[fd00::2]:80"},
			{Label: "-", Proto: "udp", Addr: "10.0.0.3:53"},
			{Label: "tab\tand\nnewline", Proto: "tcp", Addr: "10.0.0.3:80"},
		}, Timeout: 300 * time.Millisecond, Tries: 5},
		{Name: "r", Targets: []Target{{Label: "one", Proto: "tcp", Addr: "10.0.0.2:80"}}},
	} {
		got, err := parseConfig(c.Role(), c.Args(), io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", c.Args(), err)
		}
		if want := c.withDefaults(); !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %q:\n got %#v\nwant %#v", c.Args(), got, want)
		}
	}
}

func TestReachValidate(t *testing.T) {
	ok := Target{Label: "y/b TCP/80", Proto: "tcp", Addr: "10.0.0.2:80"}
	for _, c := range []struct {
		why string
		cfg Reach
	}{
		{"no name", Reach{Targets: []Target{ok}}},
		{"name of two words", Reach{Name: "a b", Targets: []Target{ok}}},
		{"no target", Reach{Name: "r"}},
		{"empty label", Reach{Name: "r", Targets: []Target{{Proto: "tcp", Addr: "10.0.0.2:80"}}}},
		{"label twice", Reach{Name: "r", Targets: []Target{ok, ok}}},
		{"label not UTF-8", Reach{Name: "r", Targets: []Target{{Label: "\xff", Proto: "tcp", Addr: "10.0.0.2:80"}}}},
		{"label too long", Reach{Name: "r", Targets: []Target{{Label: strings.Repeat(" ", 70), Proto: "tcp", Addr: "10.0.0.2:80"}}}},
		{"sctp", Reach{Name: "r", Targets: []Target{{Label: "x", Proto: "sctp", Addr: "10.0.0.2:80"}}}},
		{"TCP in capitals", Reach{Name: "r", Targets: []Target{{Label: "x", Proto: "TCP", Addr: "10.0.0.2:80"}}}},
		{"no port", Reach{Name: "r", Targets: []Target{{Label: "x", Proto: "tcp", Addr: "10.0.0.2"}}}},
		{"negative tries", Reach{Name: "r", Targets: []Target{ok}, Tries: -1}},
	} {
		if err := c.cfg.Validate(); err == nil {
			t.Errorf("%s: no validation error for %#v", c.why, c.cfg)
		}
	}
	if err := (Reach{Name: "r", Targets: []Target{ok}}).Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
	if _, err := parseConfig(RoleReach, []string{"-name=r", "-target=tcp:10.0.0.2:80"}, io.Discard); err == nil {
		t.Error("a -target without proto,addr,label accepted")
	}
}

func TestReachLabelsOnTheWire(t *testing.T) {
	for _, label := range []string{"", "-", "np", "y/b TCP/80", "50% off", "%2D", "a\tb\r\nc", "ünï cödé"} {
		r := request{kind: reqUDP, from: "reach-a", seq: 7, sent: 99, label: label}
		line := r.append(nil)
		if f := bytes.Fields(line); len(f) != 6 {
			t.Errorf("label %q: the request %q is not six fields", label, line)
		}
		if got, ok := parseRequest(line); !ok || got != r {
			t.Errorf("label %q: parseRequest(%q) = %+v, %v", label, line, got, ok)
		}
	}
	if _, ok := parseRequest([]byte("DPC1 U a 1 2 bad%zz\n")); ok {
		t.Error("a malformed escape accepted")
	}
}

// freeLoopbackPorts returns n TCP ports and n UDP ports on loopback that nobody
// listens on right now.
func freeLoopbackPorts(t *testing.T, n int) (tcp, udp []int) {
	t.Helper()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tcp, udp = append(tcp, l.Addr().(*net.TCPAddr).Port), append(udp, c.LocalAddr().(*net.UDPAddr).Port)
	}
	return tcp, udp
}

// runInProcess runs a role in this process and returns once it is ready; wait waits
// until it exits by itself and returns its exit code and events. A role still running
// when the test ends is stopped (its stdin closed).
func runInProcess(t *testing.T, args ...string) (wait func() (int, []Event)) {
	t.Helper()
	stdin, stdinW := io.Pipe()
	stdoutR, stdout := io.Pipe()
	code, events := make(chan int, 1), make(chan []Event, 1)
	go func() {
		code <- run(args, stdin, stdout, io.Discard)
		stdout.Close()
	}()
	ready := make(chan bool, 1)
	go func() {
		var got []Event
		d := NewDecoder(stdoutR)
		for e, err := d.Decode(); err == nil; e, err = d.Decode() {
			if e.Kind == KindReady && len(ready) == 0 {
				ready <- true
			}
			got = append(got, e)
		}
		close(ready)
		events <- got
	}()
	var once sync.Once
	var c int
	var evs []Event
	wait = func() (int, []Event) {
		once.Do(func() {
			c, evs = <-code, <-events
			stdinW.Close()
		})
		return c, evs
	}
	t.Cleanup(func() {
		stdinW.Close()
		wait()
	})
	if !<-ready {
		c, evs := wait()
		t.Fatalf("%v exited with %d before it was ready: %+v", args, c, evs)
	}
	return wait
}

// TestReachLoopback runs a server and a reach probe in-process on loopback (no
// privilege needed): more targets than ReachParallel, served ones answered by name,
// closed TCP ports refused, closed UDP ports refused by ICMP (not rate-limited on
// loopback), one outcome for each, and a clean exit.
func TestReachLoopback(t *testing.T) {
	tcp, udp := freeLoopbackPorts(t, 2)
	runInProcess(t, "serve", "-name", "srv-a", "-tcp", strconv.Itoa(tcp[0]), "-udp", strconv.Itoa(udp[0]))
	cfg := Reach{Name: "reach-lo", Timeout: 2 * time.Second}
	want := map[string]Outcome{}
	add := func(label, proto string, port int, o Outcome) {
		cfg.Targets = append(cfg.Targets, Target{Label: label, Proto: proto, Addr: fmt.Sprintf("127.0.0.1:%d", port)})
		want[label] = o
	}
	for i := 0; i < ReachParallel+36; i++ {
		add(fmt.Sprintf("srv-a TCP/%d #%d", tcp[0], i), "tcp", tcp[0], OK)
	}
	add("srv-a UDP/served", "udp", udp[0], OK)
	add("closed TCP", "tcp", tcp[1], Refused)
	add("closed UDP", "udp", udp[1], Refused)
	start := time.Now()
	code, evs := runInProcess(t, append([]string{"reach"}, cfg.Args()...)...)()
	if code != 0 {
		t.Fatalf("exit code %d; events %+v", code, evs)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Kind != KindReach {
			continue
		}
		if seen[e.Label] {
			t.Errorf("%q reported twice", e.Label)
		}
		seen[e.Label] = true
		if e.Outcome != want[e.Label] {
			t.Errorf("%q: %s (%s), want %s", e.Label, e.Outcome, e.Err, want[e.Label])
		}
		if e.Outcome == OK && (e.Backend != "srv-a" || e.Peer == "" || e.Count != 1) {
			t.Errorf("%q: answered by %q from %q after %d tries, want srv-a from a local address after 1", e.Label, e.Backend, e.Peer, e.Count)
		}
		if tg := cfg.Targets[e.Seq-1]; tg.Label != e.Label || tg.Addr != e.Target || tg.Proto != e.Proto {
			t.Errorf("event %+v does not match target #%d %+v", e, e.Seq, tg)
		}
	}
	if len(seen) != len(cfg.Targets) {
		t.Errorf("%d outcomes for %d targets", len(seen), len(cfg.Targets))
	}
	if last := evs[len(evs)-1]; last.Kind != KindDone || last.Count != len(cfg.Targets) {
		t.Errorf("last event %+v, want done with %d", last, len(cfg.Targets))
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v on loopback: the targets did not run concurrently", d)
	}
}

// TestReachUDPSourcePorts: a reach probe's datagrams come from ports below the
// ephemeral range, so no later probe's new socket can share a flow with one of them
// that a dataplane's conntrack still holds (RESTART-FAIL-CLOSED once failed
// kube-router on a stranger's datagram from the port of a reach probe's datagram
// answered 5 s before, when the policy was not yet in force).
func TestReachUDPSourcePorts(t *testing.T) {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral port range to stay below: %v", err)
	}
	lo, err := strconv.Atoi(strings.Fields(string(data))[0])
	if err != nil || lo < reachPortLow+1000 {
		t.Skipf("the ephemeral range starts at %q: too low to stay below", data)
	}
	_, udp := freeLoopbackPorts(t, 1)
	runInProcess(t, "serve", "-name", "srv-a", "-udp", strconv.Itoa(udp[0]))
	cfg := Reach{Name: "reach-ports", Timeout: 2 * time.Second}
	for i := range 20 {
		cfg.Targets = append(cfg.Targets, Target{Label: fmt.Sprintf("udp #%d", i), Proto: "udp", Addr: fmt.Sprintf("127.0.0.1:%d", udp[0])})
	}
	code, evs := runInProcess(t, append([]string{"reach"}, cfg.Args()...)...)()
	if code != 0 {
		t.Fatalf("exit code %d; events %+v", code, evs)
	}
	n := 0
	for _, e := range evs {
		if e.Kind != KindReach {
			continue
		}
		n++
		ap, err := netip.ParseAddrPort(e.Peer)
		if e.Outcome != OK || err != nil {
			t.Fatalf("%q: %s (%s) from %q", e.Label, e.Outcome, e.Err, e.Peer)
		}
		if p := int(ap.Port()); p < reachPortLow || p >= lo {
			t.Errorf("%q sent from port %d, want one in [%d, %d): below the ephemeral range", e.Label, p, reachPortLow, lo)
		}
	}
	if n != len(cfg.Targets) {
		t.Errorf("%d outcomes for %d targets", n, len(cfg.Targets))
	}
}

// A reach probe stopped at once (its stdin ends) still reports every target once:
// tried, or skipped, never left out.
func TestReachStoppedReportsEveryTarget(t *testing.T) {
	tcp, _ := freeLoopbackPorts(t, 1)
	cfg := Reach{Name: "reach-stop"}
	for i := range 3 * ReachParallel {
		cfg.Targets = append(cfg.Targets, Target{Label: fmt.Sprintf("closed #%d", i), Proto: "tcp", Addr: fmt.Sprintf("127.0.0.1:%d", tcp[0])})
	}
	var out bytes.Buffer
	if code := run(append([]string{"reach"}, cfg.Args()...), strings.NewReader(""), &out, io.Discard); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	seen := map[string]int{}
	outcomes := map[Outcome]int{}
	d := NewDecoder(&out)
	for e, err := d.Decode(); err == nil; e, err = d.Decode() {
		if e.Kind == KindReach {
			seen[e.Label]++
			outcomes[e.Outcome]++
		}
	}
	for _, tg := range cfg.Targets {
		if seen[tg.Label] != 1 {
			t.Errorf("%q reported %d times", tg.Label, seen[tg.Label])
		}
	}
	for o := range outcomes {
		if o != Refused && o != Skipped {
			t.Errorf("outcomes %v: %s is neither tried nor skipped", outcomes, o)
		}
	}
	t.Logf("outcomes when stopped at once: %v", outcomes)
}
