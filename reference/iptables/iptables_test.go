package iptables

import (
	"reflect"
	"strings"
	"testing"
)

var testMarks = Marks{Seen: 0x01000000, Fallthrough: 0x02000000, Vouched: 0x04000000, Mask: 0x0f000000}

const (
	seenAccept        = `-m mark --mark 0x1000000/0xf000000 -m comment --comment "refdp: handled by BPF" -j ACCEPT`
	fallthroughAccept = `-m mark --mark 0x2000000/0xf000000 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "refdp: fallthrough of a flow the stack knows" -j ACCEPT`
	vouch             = `-m mark --mark 0x2000000/0xf000000 -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "refdp: the stack knows this fallthrough flow" -j MARK --set-xmark 0x4000000/0x4000000`
	vouchedAccept     = `-m mark --mark 0x6000000/0xf000000 -m comment --comment "refdp: fallthrough of a flow the stack knows" -j ACCEPT`
	toGate            = `-o veth+ -j REFDP-TO-WL`
	fromGate          = `-i veth+ -j REFDP-FROM-WL`
	gateDrop          = `-m comment --comment "refdp: workload not programmed yet" -j DROP`
)

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`-j ACCEPT`, []string{"-j", "ACCEPT"}},
		{`-m comment --comment "not -j KUBE-SERVICES" -j ACCEPT`, []string{"-m", "comment", "--comment", "not -j KUBE-SERVICES", "-j", "ACCEPT"}},
		{`-m comment --comment "say \"hi\"" -j DROP`, []string{"-m", "comment", "--comment", `say "hi"`, "-j", "DROP"}},
		{`  -s 10.0.0.0/8   -j  RETURN `, []string{"-s", "10.0.0.0/8", "-j", "RETURN"}},
	} {
		got, err := tokens(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("tokens(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := tokens(`--comment "open`); err == nil {
		t.Error("an unterminated quote is not an error")
	}
}

func TestParseSave(t *testing.T) {
	d, err := parseSave(kubeProxyDump)
	if err != nil {
		t.Fatal(err)
	}
	nat := d.table("nat")
	if nat == nil || !nat.builtin["PREROUTING"] || nat.builtin["KUBE-SERVICES"] || !nat.has("KUBE-SVC-ABC") {
		t.Fatalf("nat table parsed wrong: %+v", nat)
	}
	var targets []string
	for _, r := range d.table("filter").rulesOf("FORWARD") {
		targets = append(targets, r.target)
	}
	want := []string{"KUBE-PROXY-FIREWALL", "KUBE-FORWARD", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "ACCEPT", "DPC-PLANTED"}
	if !reflect.DeepEqual(targets, want) {
		t.Errorf("FORWARD targets = %q, want %q (a comment is not a jump)", targets, want)
	}
	for _, bad := range []string{"-A INPUT -j ACCEPT\n", "*filter\n-I INPUT -j ACCEPT\nCOMMIT\n", "*filter\n:\nCOMMIT\n"} {
		if _, err := parseSave(bad); err == nil {
			t.Errorf("parseSave(%q) succeeded", bad)
		}
	}
}

// TestForwardLayout checks FORWARD's order, which is what makes the fault Calico's
// bug: the vouching mark (no verdict), the workload gates, SEEN, then the workload
// dispatch, then the fallthrough accept. A pre-existing flow from or to a workload is
// accepted by the dispatch whatever comes after it; only a flow that enters and leaves
// by the host interface reaches the fallthrough accept, and the fault removes it from
// FORWARD alone. The gates come before SEEN, so that a pod interface without its
// programs passes nothing, not even what the host interface's programs marked.
// TestUngated: the chains of a first start on a node refdp never programmed have no
// jumps to the gates, and keep everything else.
func TestUngated(t *testing.T) {
	cfg := Config{Marks: Marks{Seen: 0x1000000, Fallthrough: 0x2000000, Vouched: 0x4000000, Mask: 0xf000000}}
	gated := Rules(cfg)
	cfg.Ungated = true
	ungated := Rules(cfg)
	for _, jump := range []string{"-j " + ToWorkloadChain, "-j " + FromWorkloadChain} {
		if !strings.Contains(gated, jump) {
			t.Errorf("the gated chains lack %q:\n%s", jump, gated)
		}
		if strings.Contains(ungated, jump) {
			t.Errorf("the ungated chains jump to a gate (%q):\n%s", jump, ungated)
		}
	}
	for _, l := range strings.Split(ungated, "\n") {
		if !strings.Contains(gated, l) {
			t.Errorf("the ungated chains have a rule the gated do not: %q", l)
		}
	}
}

func TestForwardLayout(t *testing.T) {
	for _, tc := range []struct {
		name         string
		cfg          Config
		input, fwd   []string
		toWL, fromWL []string
	}{
		{
			name:   "no workloads: every pod interface closed",
			cfg:    Config{Marks: testMarks},
			input:  []string{fromGate, seenAccept, fallthroughAccept},
			fwd:    []string{vouch, toGate, fromGate, seenAccept, vouchedAccept},
			toWL:   []string{gateDrop},
			fromWL: []string{gateDrop},
		},
		{
			name:  "workloads, sorted and once each",
			cfg:   Config{Marks: testMarks, Workloads: []string{"veth-b", "veth-a", "veth-b"}},
			input: []string{fromGate, seenAccept, fallthroughAccept},
			fwd: []string{
				vouch,
				toGate,
				fromGate,
				seenAccept,
				`-i veth-a -m comment --comment "refdp: from workload" -j ACCEPT`,
				`-o veth-a -m comment --comment "refdp: to workload" -j ACCEPT`,
				`-i veth-b -m comment --comment "refdp: from workload" -j ACCEPT`,
				`-o veth-b -m comment --comment "refdp: to workload" -j ACCEPT`,
				vouchedAccept,
			},
			toWL:   []string{"-o veth-a -j RETURN", "-o veth-b -j RETURN", gateDrop},
			fromWL: []string{"-i veth-a -j RETURN", "-i veth-b -j RETURN", gateDrop},
		},
		{
			name:  "another interface prefix",
			cfg:   Config{Marks: testMarks, WorkloadPrefix: "cali", Workloads: []string{"cali1"}},
			input: []string{`-i cali+ -j REFDP-FROM-WL`, seenAccept, fallthroughAccept},
			fwd: []string{
				vouch,
				`-o cali+ -j REFDP-TO-WL`,
				`-i cali+ -j REFDP-FROM-WL`,
				seenAccept,
				`-i cali1 -m comment --comment "refdp: from workload" -j ACCEPT`,
				`-o cali1 -m comment --comment "refdp: to workload" -j ACCEPT`,
				vouchedAccept,
			},
			toWL:   []string{"-o cali1 -j RETURN", gateDrop},
			fromWL: []string{"-i cali1 -j RETURN", gateDrop},
		},
		{
			name:  "fault no-forward-fallthrough-accept",
			cfg:   Config{Marks: testMarks, Workloads: []string{"veth-a"}, NoForwardFallthroughAccept: true},
			input: []string{fromGate, seenAccept, fallthroughAccept},
			fwd: []string{
				vouch,
				toGate,
				fromGate,
				seenAccept,
				`-i veth-a -m comment --comment "refdp: from workload" -j ACCEPT`,
				`-o veth-a -m comment --comment "refdp: to workload" -j ACCEPT`,
			},
			toWL:   []string{"-o veth-a -j RETURN", gateDrop},
			fromWL: []string{"-i veth-a -j RETURN", gateDrop},
		},
		{
			name:  "fault host-seen-before-gates",
			cfg:   Config{Marks: testMarks, Workloads: []string{"veth-a"}, HostSeenFirst: "eth0"},
			input: []string{fromGate, seenAccept, fallthroughAccept},
			fwd: []string{
				vouch,
				`-i eth0 -m mark --mark 0x1000000/0xf000000 -m comment --comment "refdp: handled by BPF on the host interface" -j ACCEPT`,
				toGate,
				fromGate,
				seenAccept,
				`-i veth-a -m comment --comment "refdp: from workload" -j ACCEPT`,
				`-o veth-a -m comment --comment "refdp: to workload" -j ACCEPT`,
				vouchedAccept,
			},
			toWL:   []string{"-o veth-a -j RETURN", gateDrop},
			fromWL: []string{"-i veth-a -j RETURN", gateDrop},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := parseSave(Rules(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			f := d.table("filter")
			for _, c := range []struct {
				chain string
				want  []string
			}{{InputChain, tc.input}, {ForwardChain, tc.fwd}, {ToWorkloadChain, tc.toWL}, {FromWorkloadChain, tc.fromWL}} {
				if got := specs(f.rulesOf(c.chain)); !reflect.DeepEqual(got, c.want) {
					t.Errorf("%s =\n%s\nwant\n%s", c.chain, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
				}
			}
			if got := workloadsOf(d); !reflect.DeepEqual(got, workloads(tc.cfg.Workloads)) {
				t.Errorf("workloadsOf = %q, want %q", got, workloads(tc.cfg.Workloads))
			}
		})
	}
}

// TestWorkloadsOfEarlierLayout checks that an agent that starts adopts the workloads
// of chains an earlier version wrote, without the gates.
func TestWorkloadsOfEarlierLayout(t *testing.T) {
	d, err := parseSave("*filter\n:FORWARD DROP [0:0]\n:REFDP-FORWARD - [0:0]\n-A FORWARD -j REFDP-FORWARD\n" +
		"-A REFDP-FORWARD -m mark --mark 0x1000000/0xf000000 -m comment --comment \"refdp: handled by BPF\" -j ACCEPT\n" +
		"-A REFDP-FORWARD -i veth9 -m comment --comment \"refdp: from workload\" -j ACCEPT\n" +
		"-A REFDP-FORWARD -o veth9 -m comment --comment \"refdp: to workload\" -j ACCEPT\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := workloadsOf(d); !reflect.DeepEqual(got, []string{"veth9"}) {
		t.Errorf("workloadsOf = %q, want [veth9]", got)
	}
	if got := workloadsOf(&dump{}); got != nil {
		t.Errorf("workloadsOf a node without refdp = %q", got)
	}
}

func specs(rules []rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.spec)
	}
	return out
}

func TestEnsureScript(t *testing.T) {
	cfg := Config{Marks: testMarks}
	chains := strings.TrimSuffix(strings.TrimPrefix(Rules(cfg), "*filter\n"), "COMMIT\n")
	for _, tc := range []struct {
		name, save, want string
	}{
		{
			name: "fresh node",
			save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n-A FORWARD -j DPC-PLANTED\nCOMMIT\n",
			want: chains + "-I INPUT 1 -j REFDP-INPUT\n-I FORWARD 1 -j REFDP-FORWARD\n",
		},
		{
			name: "no filter table yet",
			save: "",
			want: chains + "-I INPUT 1 -j REFDP-INPUT\n-I FORWARD 1 -j REFDP-FORWARD\n",
		},
		{
			name: "jumps in place",
			save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:REFDP-INPUT - [0:0]\n:REFDP-FORWARD - [0:0]\n-A INPUT -j REFDP-INPUT\n-A INPUT -j KUBE-FIREWALL\n-A FORWARD -j REFDP-FORWARD\nCOMMIT\n",
			want: chains,
		},
		{
			name: "a jump not first, and one twice",
			save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:REFDP-INPUT - [0:0]\n:REFDP-FORWARD - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A INPUT -j REFDP-INPUT\n-A FORWARD -j REFDP-FORWARD\n-A FORWARD -i eth0 -j REFDP-FORWARD\nCOMMIT\n",
			want: chains + "-D INPUT -j REFDP-INPUT\n-I INPUT 1 -j REFDP-INPUT\n-D FORWARD -j REFDP-FORWARD\n-D FORWARD -i eth0 -j REFDP-FORWARD\n-I FORWARD 1 -j REFDP-FORWARD\n",
		},
		{
			name: "the chain of an earlier version",
			save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:REFDP-ACCEPT - [0:0]\n-A INPUT -j REFDP-ACCEPT\n-A FORWARD -j REFDP-ACCEPT\n-A REFDP-ACCEPT -j ACCEPT\nCOMMIT\n",
			want: ":REFDP-ACCEPT - [0:0]\n" + chains + "-I INPUT 1 -j REFDP-INPUT\n-I FORWARD 1 -j REFDP-FORWARD\n-D INPUT -j REFDP-ACCEPT\n-D FORWARD -j REFDP-ACCEPT\n-X REFDP-ACCEPT\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := parseSave(tc.save)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := ensureScript(d, cfg), "*filter\n"+tc.want+"COMMIT\n"; got != want {
				t.Errorf("ensureScript =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestRemoveScript(t *testing.T) {
	d, err := parseSave("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:REFDP-INPUT - [0:0]\n:REFDP-FORWARD - [0:0]\n:REFDP-TO-WL - [0:0]\n:REFDP-FROM-WL - [0:0]\n:OTHER - [0:0]\n" +
		"-A INPUT -j REFDP-INPUT\n-A FORWARD -j REFDP-FORWARD\n-A OTHER -j REFDP-FORWARD\n-A FORWARD -j OTHER\n-A REFDP-FORWARD -j ACCEPT\n" +
		"-A REFDP-INPUT -i veth+ -j REFDP-FROM-WL\n-A REFDP-FORWARD -o veth+ -j REFDP-TO-WL\n-A REFDP-TO-WL -j DROP\n-A REFDP-FROM-WL -j DROP\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	// The gates' jumps come from our own chains: they go with their flush, no -D.
	want := "*filter\n:REFDP-INPUT - [0:0]\n:REFDP-FORWARD - [0:0]\n:REFDP-TO-WL - [0:0]\n:REFDP-FROM-WL - [0:0]\n" +
		"-D INPUT -j REFDP-INPUT\n-D FORWARD -j REFDP-FORWARD\n-D OTHER -j REFDP-FORWARD\n" +
		"-X REFDP-INPUT\n-X REFDP-FORWARD\n-X REFDP-TO-WL\n-X REFDP-FROM-WL\nCOMMIT\n"
	if got := removeScript(d); got != want {
		t.Errorf("removeScript =\n%s\nwant\n%s", got, want)
	}
	clean, _ := parseSave("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n")
	if got := removeScript(clean); got != "" {
		t.Errorf("removeScript of a node without refdp = %q, want nothing", got)
	}
}

func TestKubeProxyOwns(t *testing.T) {
	tb := &table{builtin: map[string]bool{"FORWARD": true}}
	for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-FORWARD", "KUBE-SVC-NPX46M4PTMTKRN6Y", "KUBE-SVL-X", "KUBE-SEP-X",
		"KUBE-FW-X", "KUBE-XLB-X", "KUBE-EXT-X", "KUBE-EXTERNAL-SERVICES", "KUBE-POSTROUTING", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY", "KUBE-NODE-PORT"} {
		if !tb.kubeProxyOwns(c) {
			t.Errorf("%s is kube-proxy's", c)
		}
	}
	for _, c := range []string{"KUBE-MARK-MASQ", "KUBE-MARK-DROP", "KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "FORWARD", "ACCEPT", "", "DPC-PLANTED", "KUBE-SERVICESX"} {
		if tb.kubeProxyOwns(c) {
			t.Errorf("%q is not kube-proxy's", c)
		}
	}
}

func TestKubeProxyScript(t *testing.T) {
	d, err := parseSave(kubeProxyDump)
	if err != nil {
		t.Fatal(err)
	}
	script, what := kubeProxyScript(d)
	after := applyScript(t, d, script)
	for _, tb := range after.tables {
		for _, c := range tb.chains {
			if tb.kubeProxyOwns(c) {
				t.Errorf("%s %s is left", tb.name, c)
			}
		}
		for _, r := range tb.rules {
			if tb.kubeProxyOwns(r.target) {
				t.Errorf("%s -A %s %s is left", tb.name, r.chain, r.spec)
			}
		}
	}
	if got := dumpLines(after); !reflect.DeepEqual(got, kubeProxyDumpAfter) {
		t.Errorf("after removal:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(kubeProxyDumpAfter, "\n"))
	}
	if len(what) == 0 || !strings.Contains(strings.Join(what, "\n"), `filter -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`) {
		t.Errorf("what removed does not name FORWARD's jump to KUBE-FORWARD:\n%s", strings.Join(what, "\n"))
	}
	if script, what := kubeProxyScript(after); script != "" || what != nil {
		t.Errorf("a node without kube-proxy's rules gets a script:\n%s", script)
	}
}

// applyScript applies an iptables-restore --noflush script of declarations, -D and -X
// to d, as iptables-restore would, failing on what iptables-restore would refuse.
func applyScript(t *testing.T, d *dump, script string) *dump {
	t.Helper()
	var cur *table
	for _, line := range strings.Split(script, "\n") {
		switch {
		case line == "" || line == "COMMIT":
		case strings.HasPrefix(line, "*"):
			cur = d.table(line[1:])
		case strings.HasPrefix(line, ":"):
			c := strings.Fields(line[1:])[0]
			if !cur.has(c) {
				cur.chains = append(cur.chains, c)
			}
			var keep []rule
			for _, r := range cur.rules {
				if r.chain != c {
					keep = append(keep, r)
				}
			}
			cur.rules = keep
		case strings.HasPrefix(line, "-D "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			i := 0
			for i < len(cur.rules) && (cur.rules[i].chain != chain || cur.rules[i].spec != spec) {
				i++
			}
			if i == len(cur.rules) {
				t.Fatalf("%s: no such rule", line)
			}
			cur.rules = append(cur.rules[:i], cur.rules[i+1:]...)
		case strings.HasPrefix(line, "-X "):
			c := line[3:]
			for _, r := range cur.rules {
				if r.chain == c || r.target == c {
					t.Fatalf("%s: chain not empty or still referenced by -A %s %s", line, r.chain, r.spec)
				}
			}
			var keep []string
			for _, x := range cur.chains {
				if x != c {
					keep = append(keep, x)
				}
			}
			cur.chains = keep
		default:
			t.Fatalf("unexpected script line %q", line)
		}
	}
	return d
}

// dumpLines renders d as "table :CHAIN" and "table -A CHAIN spec" lines.
func dumpLines(d *dump) []string {
	var out []string
	for _, t := range d.tables {
		for _, c := range t.chains {
			out = append(out, t.name+" :"+c)
		}
		for _, r := range t.rules {
			out = append(out, t.name+" -A "+r.chain+" "+r.spec)
		}
	}
	return out
}

// kubeProxyDump is what kube-proxy (iptables mode, v1.3x) writes for one NodePort
// service with one endpoint, as iptables-save prints it, plus rules of others: the
// DPC-PLANTED chain, a commented accept in FORWARD whose comment reads like a jump, a
// jump to KUBE-MARK-MASQ from a chain that stays, and a MASQUERADE in POSTROUTING.
const kubeProxyDump = `# Generated by iptables-nft-save v1.8.9 (nf_tables)
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DPC-PLANTED - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -s 10.244.0.0/16 -m comment --comment "dpc: planted, not -j KUBE-FORWARD" -j ACCEPT
-A FORWARD -j DPC-PLANTED
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A DPC-PLANTED -s 192.0.2.1/32 -j DROP
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DPC-PLANTED - [0:0]
:KUBE-EXT-ABC - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-DEF - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.244.1.0/24 ! -d 10.244.0.0/16 -m comment --comment "dpc: planted" -j MASQUERADE
-A DPC-PLANTED -s 192.0.2.1/32 -j KUBE-MARK-MASQ
-A KUBE-EXT-ABC -m comment --comment "masquerade traffic for default/web external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-ABC -j KUBE-SVC-ABC
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web" -m tcp --dport 30080 -j KUBE-EXT-ABC
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-DEF -s 10.244.1.5/32 -m comment --comment "default/web" -j KUBE-MARK-MASQ
-A KUBE-SEP-DEF -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-SVC-ABC
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-ABC ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-ABC -m comment --comment "default/web -> 10.244.1.5:8080" -j KUBE-SEP-DEF
COMMIT
`

// kubeProxyDumpAfter is kubeProxyDump without kube-proxy's chains and jumps: kubelet's
// chains and everyone else's rules stay.
var kubeProxyDumpAfter = []string{
	"mangle :PREROUTING", "mangle :INPUT", "mangle :FORWARD", "mangle :OUTPUT", "mangle :POSTROUTING",
	"mangle :KUBE-IPTABLES-HINT", "mangle :KUBE-KUBELET-CANARY",
	"filter :INPUT", "filter :FORWARD", "filter :OUTPUT", "filter :DPC-PLANTED", "filter :KUBE-FIREWALL", "filter :KUBE-KUBELET-CANARY",
	"filter -A INPUT -j KUBE-FIREWALL",
	`filter -A FORWARD -s 10.244.0.0/16 -m comment --comment "dpc: planted, not -j KUBE-FORWARD" -j ACCEPT`,
	"filter -A FORWARD -j DPC-PLANTED",
	"filter -A OUTPUT -j KUBE-FIREWALL",
	"filter -A DPC-PLANTED -s 192.0.2.1/32 -j DROP",
	`filter -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
	"nat :PREROUTING", "nat :INPUT", "nat :OUTPUT", "nat :POSTROUTING", "nat :DPC-PLANTED", "nat :KUBE-KUBELET-CANARY", "nat :KUBE-MARK-MASQ",
	`nat -A POSTROUTING -s 10.244.1.0/24 ! -d 10.244.0.0/16 -m comment --comment "dpc: planted" -j MASQUERADE`,
	"nat -A DPC-PLANTED -s 192.0.2.1/32 -j KUBE-MARK-MASQ",
	"nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
}
