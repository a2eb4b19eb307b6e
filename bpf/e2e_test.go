package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// world is a throwaway topology of network namespaces, built and entered by
// the test's goroutine (locked to its thread by enterNewNetns):
//
//	ext (client 10.200.0.2, bridge br0 = the fabric)
//	 ├─ node1 eth0 10.200.0.1   pods: a 10.244.0.5 (client), b 10.244.0.7 (server)
//	 └─ node2 eth0 10.200.0.3   pods: c 10.244.1.10 (server)
//
// Pods are wired as the CNI ptp plugin does: a /32 on the pod's eth0, the
// gateway address on the host-side veth, a /32 route to the pod on the node.
type world struct {
	t   *testing.T
	ext netns.NsHandle
	ns  map[string]netns.NsHandle
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, ext: enterNewNetns(t), ns: map[string]netns.NsHandle{}}
	w.ns["ext"] = w.ext
	return w
}

// newNS creates a namespace and leaves the thread in it.
func (w *world) newNS(name string) netns.NsHandle {
	h, err := netns.New()
	must(w.t, err)
	w.t.Cleanup(func() { h.Close() })
	w.ns[name] = h
	return h
}

func (w *world) enter(name string) {
	w.t.Helper()
	must(w.t, netns.Set(w.ns[name]))
}

func (w *world) sysctl(key, value string) {
	w.t.Helper()
	must(w.t, os.WriteFile(filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")), []byte(value), 0o644))
}

func (w *world) link(name string) netlink.Link {
	w.t.Helper()
	l, err := netlink.LinkByName(name)
	must(w.t, err)
	return l
}

func (w *world) addr(name, cidr string) {
	w.t.Helper()
	a, err := netlink.ParseAddr(cidr)
	must(w.t, err)
	must(w.t, netlink.AddrAdd(w.link(name), a))
}

func (w *world) route(dst, gw, dev string) {
	w.t.Helper()
	r := &netlink.Route{Dst: mustPrefix(w.t, dst)}
	if dev != "" {
		r.LinkIndex = w.link(dev).Attrs().Index
		r.Scope = netlink.SCOPE_LINK
	}
	if gw != "" {
		r.Gw = net.ParseIP(gw)
		r.Scope = netlink.SCOPE_UNIVERSE
	}
	must(w.t, netlink.RouteAdd(r))
}

func mustPrefix(t *testing.T, s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	must(t, err)
	return n
}

// veth creates a veth pair in namespace from, moves the peer to namespace to
// as peerName, and brings both up. It returns to namespace from.
func (w *world) veth(from, name, to, peerName string) {
	w.t.Helper()
	w.enter(from)
	tmp := "tmp-" + to + "-" + peerName // unique in a world, under 16 bytes
	must(w.t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: tmp}))
	must(w.t, netlink.LinkSetNsFd(w.link(tmp), int(w.ns[to])))
	must(w.t, netlink.LinkSetUp(w.link(name)))
	w.enter(to)
	must(w.t, netlink.LinkSetName(w.link(tmp), peerName))
	must(w.t, netlink.LinkSetUp(w.link(peerName)))
	w.enter(from)
}

func (w *world) node(name, ip string) {
	w.newNS(name)
	w.sysctl("net.ipv4.ip_forward", "1")
	w.sysctl("net.ipv4.conf.all.rp_filter", "0")
	w.sysctl("net.ipv4.conf.default.rp_filter", "0")
	must(w.t, netlink.LinkSetUp(w.link("lo")))
	w.veth(name, "eth0", "ext", name)
	w.addr("eth0", ip+"/24")
	w.enter("ext")
	must(w.t, netlink.LinkSetMaster(w.link(name), w.link("br0")))
}

// pod wires a pod namespace to node as ptp does, and serves TCP and UDP on
// port 8080: each answer is "<pod> <peer address>".
func (w *world) pod(node, name, ip, gw string) {
	w.newNS(name)
	must(w.t, netlink.LinkSetUp(w.link("lo")))
	w.veth(node, "veth-"+name, name, "eth0")
	w.addr("veth-"+name, gw+"/32")
	w.route(ip+"/32", "", "veth-"+name)
	w.enter(name)
	w.addr("eth0", ip+"/32")
	w.route(gw+"/32", "", "eth0")
	w.route("0.0.0.0/0", gw, "")
	w.serve(name)
}

func (w *world) serve(name string) {
	ln, err := net.Listen("tcp4", ":8080")
	must(w.t, err)
	pc, err := net.ListenPacket("udp4", ":8080")
	must(w.t, err)
	w.t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(fmt.Sprintf("%s %s", name, from)), from)
		}
	}()
}

// dialTCP connects from namespace ns to dst and returns the first line.
func (w *world) dialTCP(ns, dst string) (string, error) {
	w.enter(ns)
	c, err := net.DialTimeout("tcp4", dst, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// askUDP sends a datagram from namespace ns to dst, from an unconnected
// socket, and returns the answer and where it came from.
func (w *world) askUDP(ns, dst string) (string, netip.AddrPort, error) {
	w.enter(ns)
	c, err := net.ListenUDP("udp4", nil)
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer c.Close()
	to := net.UDPAddrFromAddrPort(ipp(dst))
	buf := make([]byte, 1500)
	for try := 0; try < 3; try++ { // the first may wait for ARP
		if _, err := c.WriteToUDP([]byte("ping"), to); err != nil {
			return "", netip.AddrPort{}, err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err == nil {
			return string(buf[:n]), from, nil
		}
	}
	return "", netip.AddrPort{}, fmt.Errorf("no UDP answer from %s", dst)
}

// churnTCP opens n short TCP connections from namespace ns to dst, one after
// the other. The server closes first (pods answer and close): the client
// reads until EOF, then closes. It gives up after maxErrs failures, and
// returns how many connections it tried, how many took more than a second
// (a SYN retransmitted), and the errors.
func (w *world) churnTCP(ns, dst string, n, maxErrs int) (tried, slow int, errs []error) {
	w.enter(ns)
	buf := make([]byte, 256)
	for ; tried < n && len(errs) < maxErrs; tried++ {
		i := tried
		start := time.Now()
		err := func() error {
			c, err := net.DialTimeout("tcp4", dst, 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			got := 0
			for {
				k, err := c.Read(buf)
				got += k
				if err != nil {
					if got == 0 || !errors.Is(err, io.EOF) {
						return fmt.Errorf("read after %d bytes: %w", got, err)
					}
					return nil
				}
			}
		}()
		if err != nil {
			errs = append(errs, fmt.Errorf("connection %d: %w", i, err))
		}
		if time.Since(start) > time.Second {
			slow++
		}
	}
	return tried, slow, errs
}

func TestEndToEnd(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		mode    AttachMode
		forward bool // FORWARD policy DROP, accepting only MarkSeen
		churn   bool // and the NodePort SNAT churn (~8 s): in one mode that always runs
	}{
		{AttachTCX, false, false},
		{AttachClsact, false, true},
		{AttachTCX, true, false},
	} {
		name := string(tc.mode)
		if tc.forward {
			name += "/forward-drop-accept-mark"
		}
		t.Run(name, func(t *testing.T) {
			if tc.mode == AttachTCX {
				if err := HaveTCX(); err != nil {
					t.Skipf("SKIPPED: %v", err)
				}
			}
			testEndToEnd(t, Options{ForceClsact: tc.mode == AttachClsact}, tc.forward, tc.churn)
		})
	}
}

func testEndToEnd(t *testing.T, opts Options, forwardDrop, churn bool) {
	w := newWorld(t)
	must(t, netlink.LinkSetUp(w.link("lo")))
	must(t, netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}))
	must(t, netlink.LinkSetUp(w.link("br0")))
	w.addr("br0", "10.200.0.2/24")

	w.node("node1", "10.200.0.1")
	w.node("node2", "10.200.0.3")
	w.enter("node1")
	w.route("10.244.1.0/24", "10.200.0.3", "")
	w.enter("node2")
	w.route("10.244.0.0/24", "10.200.0.1", "")
	w.pod("node1", "a", "10.244.0.5", "10.244.0.1")
	w.pod("node1", "b", "10.244.0.7", "10.244.0.1")
	w.pod("node2", "c", "10.244.1.10", "10.244.1.1")

	// The datapath on both nodes; services on node1.
	pins := map[string]string{}
	dps := map[string]*Datapath{}
	for node, ip := range map[string]string{"node1": "10.200.0.1", "node2": "10.200.0.3"} {
		pins[node] = bpffs(t)
		w.enter(node)
		d := open(t, pins[node], opts)
		dps[node] = d
		eth0 := w.link("eth0").Attrs().Index
		must(t, d.SetConfig(netip.MustParseAddr(ip), eth0))
		must(t, d.AttachHost(eth0))
	}
	w.enter("node1")
	must(t, dps["node1"].AttachEndpointByName("veth-a", ip("10.244.0.5"), EndpointAntiSpoof))
	must(t, dps["node1"].AttachEndpointByName("veth-b", ip("10.244.0.7"), EndpointAntiSpoof))
	w.enter("node2")
	must(t, dps["node2"].AttachEndpointByName("veth-c", ip("10.244.1.10"), EndpointAntiSpoof))
	t.Cleanup(func() {
		// Everything is gone with the namespaces and the bpffs mounts;
		// Remove is exercised all the same.
		for node, dir := range pins {
			if err := netns.Set(w.ns[node]); err == nil {
				if err := Remove(dir); err != nil {
					t.Errorf("remove %s: %v", node, err)
				}
			}
		}
	})

	d := dps["node1"]
	const podB, podC = "10.244.0.7:8080", "10.244.1.10:8080"
	for i, s := range []struct {
		frontend string
		proto    Proto
		backend  string
	}{
		{"10.200.0.1:30080", TCP, podB},
		{"10.200.0.1:30081", TCP, podC},
		{"10.200.0.1:30080", UDP, podB},
		{"10.200.0.1:30081", UDP, podC},
		{"10.96.0.10:80", TCP, podB},
		{"10.96.0.11:80", TCP, podC},
		{"10.96.0.10:53", UDP, podB},
		{"10.96.0.11:53", UDP, podC},
	} {
		service(t, d, s.frontend, s.proto, uint32(i+1), s.backend)
	}

	if forwardDrop {
		w.enter("node1")
		if _, err := exec.LookPath("iptables"); err != nil {
			t.Skipf("SKIPPED: no iptables: %v", err)
		}
		for _, args := range [][]string{
			{"-P", "FORWARD", "DROP"},
			{"-A", "FORWARD", "-m", "mark", "--mark", fmt.Sprintf("%#x/%#x", MarkSeen, MarkMask), "-j", "ACCEPT"},
		} {
			if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
				t.Skipf("SKIPPED: iptables %v in a netns: %v: %s", args, err, out)
			}
		}
	}

	snatPort := func(s string) bool {
		ap, err := netip.ParseAddrPort(s)
		return err == nil && ap.Addr() == ip("10.200.0.1") && ap.Port() >= SNATPortMin
	}
	for _, c := range []struct {
		name, from, to string
		want           func(peer string) bool
		wantPod        string
	}{
		{"NodePort TCP, local backend, client IP kept", "ext", "10.200.0.1:30080", func(p string) bool { return strings.HasPrefix(p, "10.200.0.2:") }, "b"},
		{"NodePort TCP, remote backend, SNAT", "ext", "10.200.0.1:30081", snatPort, "c"},
		{"ClusterIP TCP, local backend", "a", "10.96.0.10:80", func(p string) bool { return strings.HasPrefix(p, "10.244.0.5:") }, "b"},
		{"ClusterIP TCP, remote backend", "a", "10.96.0.11:80", func(p string) bool { return strings.HasPrefix(p, "10.244.0.5:") }, "c"},
		{"pod to pod, remote", "a", podC, func(p string) bool { return strings.HasPrefix(p, "10.244.0.5:") }, "c"},
		{"pod to NodePort of its node", "a", "10.200.0.1:30081", func(p string) bool { return strings.HasPrefix(p, "10.244.0.5:") }, "c"},
	} {
		line, err := w.dialTCP(c.from, c.to)
		f := strings.Fields(line)
		if err != nil || len(f) != 2 || f[0] != c.wantPod || !c.want(f[1]) {
			t.Errorf("%s: %s -> %s: got %q, %v", c.name, c.from, c.to, line, err)
		}
	}
	if churn {
		testSNATChurn(t, w, d)
	}

	for _, c := range []struct {
		name, from, to string
		wantPod        string
	}{
		{"NodePort UDP, local backend", "ext", "10.200.0.1:30080", "b"},
		{"NodePort UDP, remote backend, SNAT", "ext", "10.200.0.1:30081", "c"},
		{"ClusterIP UDP, local backend", "a", "10.96.0.10:53", "b"},
		{"ClusterIP UDP, remote backend", "a", "10.96.0.11:53", "c"},
	} {
		answer, from, err := w.askUDP(c.from, c.to)
		// The answer must come from the frontend, else a client would
		// not take it.
		if err != nil || !strings.HasPrefix(answer, c.wantPod+" ") || from != ipp(c.to) {
			t.Errorf("%s: %s -> %s: got %q from %s, %v", c.name, c.from, c.to, answer, from, err)
		}
	}

	// A spoofing pod is dropped at its interface.
	w.enter("a")
	must(t, netlink.AddrAdd(w.link("eth0"), &netlink.Addr{IPNet: mustPrefix(t, "10.244.0.99/32")}))
	dialer := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP("10.244.0.99")}}
	if c, err := dialer.Dial("tcp4", podC); err == nil {
		c.Close()
		t.Errorf("spoofed source got through")
	} else if !os.IsTimeout(err) && !strings.Contains(err.Error(), "timeout") {
		t.Logf("spoofed dial: %v", err)
	}
}

// testSNATChurn opens many more short connections to a remote backend than
// there are SNAT ports: closed flows' ports must be reused, although the
// backend holds each reused tuple in TIME_WAIT, having closed first.
func testSNATChurn(t *testing.T, w *world, d *Datapath) {
	const churn = 6000
	start := time.Now()
	tried, slow, errs := w.churnTCP("ext", "10.200.0.1:30081", churn, 5)
	snatEntries := 0
	must(t, d.Conntrack().Iterate(func(k ConntrackKey, v ConntrackValue) bool {
		if v.Flags&ConntrackSNATReply != 0 && k.Src == ip("10.244.1.10") {
			snatEntries++
		}
		return true
	}))
	t.Logf("%d of %d sequential NodePort connections to a remote backend in %s: %d over 1 s, %d failed; %d SNAT ports in use",
		tried, churn, time.Since(start).Round(time.Millisecond), slow, len(errs), snatEntries)
	for _, err := range errs {
		t.Errorf("NodePort TCP churn, remote backend: %v", err)
	}
	if len(errs) > 0 {
		t.Errorf("gave up after %d failed connections", len(errs))
	}
	if snatEntries >= churn {
		t.Errorf("%d SNAT reply entries after %d connections: no port was reused", snatEntries, churn)
	}
}
