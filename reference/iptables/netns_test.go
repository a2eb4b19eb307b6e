package iptables

import (
	"bytes"
	"context"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/dpconform/dpconform/internal/privileged"
)

// enterNewNetns moves the test's goroutine, locked to its thread, into a new network
// namespace, which goes away when the test ends. Commands the test runs inherit it.
func enterNewNetns(t *testing.T) {
	t.Helper()
	privileged.Require(t)
	for _, tool := range []string{"iptables-save", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			if privileged.Required() {
				t.Fatalf("%s not installed (`make deps`)", tool)
			}
			t.Skipf("SKIPPED: %s not installed (`make deps`)", tool)
		}
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	h, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime will retire it.
			t.Errorf("back to the original netns: %v", err)
			return
		}
		h.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
}

func sh(t *testing.T, stdin string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s\ninput:\n%s", name, strings.Join(args, " "), err, errb.String(), stdin)
	}
	return out.String()
}

// saved returns the node's tables of fam as dumpLines, normalized.
func saved(t *testing.T, fam string, tables ...string) []string {
	t.Helper()
	var out []string
	for _, tb := range tables {
		d, err := parseSave(sh(t, "", fam+"-save", "-t", tb))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, dumpLines(d)...)
	}
	return normalized(out)
}

// normalized orders dumpLines by table, then chain declarations by name, then rules,
// each chain's in their order: iptables-save prints tables and chains in an order of
// its own, but the order of the rules of a chain is what they mean.
func normalized(lines []string) []string {
	out := slices.Clone(lines)
	key := func(l string) (string, int, string) {
		tb, rest, _ := strings.Cut(l, " ")
		if strings.HasPrefix(rest, ":") {
			return tb, 0, rest
		}
		return tb, 1, strings.Fields(rest)[1]
	}
	slices.SortStableFunc(out, func(a, b string) int {
		ta, ka, na := key(a)
		tb, kb, nb := key(b)
		if c := strings.Compare(ta, tb); c != 0 {
			return c
		}
		if ka != kb {
			return ka - kb
		}
		return strings.Compare(na, nb)
	})
	return out
}

// TestRemoveKubeProxyForReal plants kube-proxy's rules and others' in a fresh network
// namespace, in iptables (three tables), ip6tables and nftables, and removes kube-proxy's.
func TestRemoveKubeProxyForReal(t *testing.T) {
	enterNewNetns(t)
	ctx := context.Background()
	sh(t, kubeProxyDump, "iptables-restore")
	v6 := false
	if _, err := exec.LookPath("ip6tables-restore"); err == nil {
		v6 = true
		sh(t, "*filter\n:FORWARD DROP [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-FIREWALL - [0:0]\n"+
			"-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n-A INPUT -j KUBE-FIREWALL\n"+
			"-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n", "ip6tables-restore")
	}
	nft := false
	if _, err := exec.LookPath("nft"); err == nil {
		nft = true
		sh(t, "add table ip kube-proxy\nadd chain ip kube-proxy services\nadd table ip6 kube-proxy\nadd table ip dpc-planted\n", "nft", "-f", "-")
	}

	removed, err := RemoveKubeProxy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed:\n%s", strings.Join(removed, "\n"))
	if got := saved(t, "iptables", "mangle", "filter", "nat"); !reflect.DeepEqual(got, normalized(kubeProxyDumpAfter)) {
		t.Errorf("iptables after removal:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(normalized(kubeProxyDumpAfter), "\n"))
	}
	if !strings.Contains(sh(t, "", "iptables-save", "-t", "filter"), ":FORWARD DROP") {
		t.Error("FORWARD's policy changed")
	}
	if v6 {
		want := normalized([]string{"filter :INPUT", "filter :FORWARD", "filter :OUTPUT", "filter :KUBE-FIREWALL", "filter -A INPUT -j KUBE-FIREWALL"})
		if got := saved(t, "ip6tables", "filter"); !reflect.DeepEqual(got, want) {
			t.Errorf("ip6tables after removal:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if nft {
		tables := sh(t, "", "nft", "list", "tables")
		if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table ip dpc-planted") {
			t.Errorf("nftables tables after removal:\n%s", tables)
		}
		for _, want := range []string{"nft ip kube-proxy", "nft ip6 kube-proxy"} {
			if !slices.Contains(removed, want) {
				t.Errorf("removed does not list %q", want)
			}
		}
	}
	for _, want := range []string{"iptables nat KUBE-SVC-ABC", "iptables filter KUBE-FORWARD", "iptables mangle KUBE-PROXY-CANARY"} {
		if !slices.Contains(removed, want) {
			t.Errorf("removed does not list %q", want)
		}
	}

	// Nothing of kube-proxy's left: nothing to do, and nothing done.
	before := saved(t, "iptables", "mangle", "filter", "nat")
	if removed, err := RemoveKubeProxy(ctx); err != nil || len(removed) != 0 {
		t.Errorf("second RemoveKubeProxy = %q, %v; want nothing removed", removed, err)
	}
	if got := saved(t, "iptables", "mangle", "filter", "nat"); !reflect.DeepEqual(got, before) {
		t.Errorf("second RemoveKubeProxy changed the rules:\n%s", strings.Join(got, "\n"))
	}
}

// TestEnsureAndRemoveForReal writes refdp's chains over a node's own rules, rewrites
// them for another set of workloads, and removes them: the node's rules end as they
// began.
func TestEnsureAndRemoveForReal(t *testing.T) {
	enterNewNetns(t)
	ctx := context.Background()
	// The node's own rules, then the chain of an earlier refdp.
	sh(t, "*filter\n:FORWARD DROP [0:0]\n:DPC-PLANTED - [0:0]\n"+
		"-A INPUT -m comment --comment \"dpc: planted\" -j ACCEPT\n-A FORWARD -j DPC-PLANTED\n-A DPC-PLANTED -s 192.0.2.1/32 -j DROP\nCOMMIT\n", "iptables-restore")
	own := saved(t, "iptables", "filter")
	sh(t, "*filter\n:REFDP-ACCEPT - [0:0]\n-I INPUT 1 -j REFDP-ACCEPT\n-A FORWARD -j REFDP-ACCEPT\n-A REFDP-ACCEPT -j ACCEPT\nCOMMIT\n", "iptables-restore", "--noflush")

	check := func(cfg Config) {
		t.Helper()
		d, err := parseSave(sh(t, "", "iptables-save", "-t", "filter"))
		if err != nil {
			t.Fatal(err)
		}
		f := d.table("filter")
		want, _ := parseSave(Rules(cfg))
		for _, p := range parents {
			rules := f.rulesOf(p.builtin)
			if len(rules) == 0 || rules[0].spec != "-j "+p.chain {
				t.Errorf("%s does not jump to %s first: %q", p.builtin, p.chain, specs(rules))
			}
			n := 0
			for _, r := range rules {
				if r.target == p.chain {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s jumps to %s %d times", p.builtin, p.chain, n)
			}
			if got, want := specs(f.rulesOf(p.chain)), specs(want.table("filter").rulesOf(p.chain)); !reflect.DeepEqual(got, want) {
				t.Errorf("%s =\n%s\nwant\n%s", p.chain, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
		for _, c := range []string{ToWorkloadChain, FromWorkloadChain} {
			if got, want := specs(f.rulesOf(c)), specs(want.table("filter").rulesOf(c)); !reflect.DeepEqual(got, want) {
				t.Errorf("%s =\n%s\nwant\n%s", c, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
		if f.has(legacyChain) {
			t.Errorf("%s is left", legacyChain)
		}
		if got, err := Workloads(ctx); err != nil || !reflect.DeepEqual(got, workloads(cfg.Workloads)) {
			t.Errorf("Workloads = %q, %v; want %q", got, err, workloads(cfg.Workloads))
		}
	}
	cfg := Config{Marks: testMarks, Workloads: []string{"veth-a", "veth-b"}}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	check(cfg)
	cfg = Config{Marks: testMarks, WorkloadPrefix: "cali", Workloads: []string{"cali-c"}, NoForwardFallthroughAccept: true}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	check(cfg)

	for i := 0; i < 2; i++ {
		if err := Remove(ctx); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
		if got := saved(t, "iptables", "filter"); !reflect.DeepEqual(got, own) {
			t.Errorf("after Remove #%d:\n%s\nwant the node's own rules\n%s", i+1, strings.Join(got, "\n"), strings.Join(own, "\n"))
		}
	}
}
