// Package nodestate reads a node's networking state black-box, from inside the node
// and with the tools an administrator would use (iptables-save, nft, conntrack), for
// specs that judge what an implementation left on a node rather than traffic: the
// FORWARD policy, the flows Linux conntrack holds, kube-proxy's rules after a switch,
// and rules planted by the suite that an implementation must leave alone.
package nodestate

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/topologies"
)

// ForwardPolicy is the policy of the filter table's FORWARD chain ("ACCEPT", "DROP").
func ForwardPolicy(ctx context.Context, n topologies.Node) (string, error) {
	out, err := topologies.Output(ctx, n, "iptables", "-w", "5", "-S", "FORWARD")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "-P" && f[1] == "FORWARD" {
			return f[2], nil
		}
	}
	return "", fmt.Errorf("iptables -S FORWARD on %s printed no policy: %q", n.Name(), out)
}

// Flow is one entry of Linux conntrack, as `conntrack -L` prints it.
type Flow struct {
	State    string // TCP state, e.g. ESTABLISHED
	OrigDst  string // ip:port the client dialled
	ReplySrc string // ip:port the reply comes from (the backend, after DNAT)
}

// NATed reports whether the flow's replies come from another address than the one
// dialled: the stack translated it (kube-proxy's DNAT).
func (f Flow) NATed() bool { return f.OrigDst != f.ReplySrc }

// ConntrackTo lists the TCP flows in the node's Linux conntrack table whose original
// destination is ip:port.
func ConntrackTo(ctx context.Context, n topologies.Node, ip string, port int) ([]Flow, error) {
	out, err := topologies.Output(ctx, n, "conntrack", "-L", "-p", "tcp", "--orig-dst", ip, "--orig-port-dst", fmt.Sprint(port))
	if err != nil {
		return nil, err
	}
	return parseConntrack(string(out)), nil
}

var ctField = regexp.MustCompile(`(src|dst|sport|dport)=(\S+)`)

// parseConntrack reads `conntrack -L` lines: "tcp 6 431999 ESTABLISHED src=A dst=B
// sport=P dport=Q src=C dst=D sport=R dport=S [ASSURED] mark=0 use=1". The first
// src/dst/sport/dport are the original direction, the second the reply.
func parseConntrack(out string) []Flow {
	var flows []Flow
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "tcp" {
			continue
		}
		var vals []string
		for _, m := range ctField.FindAllStringSubmatch(line, 8) {
			vals = append(vals, m[2])
		}
		if len(vals) < 8 {
			continue
		}
		// vals: src dst sport dport (orig), src dst sport dport (reply)
		flows = append(flows, Flow{State: f[3], OrigDst: vals[1] + ":" + vals[3], ReplySrc: vals[4] + ":" + vals[6]})
	}
	return flows
}

// kubeProxyChain matches the chains kube-proxy owns for Services, which a dataplane
// taking a node over from it must remove. KUBE-MARK-* (shared with kubelet),
// KUBE-FIREWALL and KUBE-KUBELET-CANARY (kubelet's) may stay.
var kubeProxyChain = regexp.MustCompile(`^KUBE-(SERVICES|NODEPORTS|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL|POSTROUTING|(SVC|SVL|SEP|FW|XLB|EXT)-.+)$`)

// IsKubeProxyChain reports whether chain is one of kube-proxy's service chains.
func IsKubeProxyChain(chain string) bool { return kubeProxyChain.MatchString(chain) }

// KubeProxyRules lists what of kube-proxy's service rules the node holds: its chains
// ("nat KUBE-SERVICES"), the rules of other chains that jump to them ("nat PREROUTING
// -j KUBE-SERVICES"), and its nftables tables ("nft ip kube-proxy"). Empty means a
// clean hand-over.
func KubeProxyRules(ctx context.Context, n topologies.Node) ([]string, error) {
	dump, err := topologies.Output(ctx, n, "iptables-save")
	if err != nil {
		return nil, err
	}
	left := kubeProxyRules(string(dump))
	tables, err := topologies.Output(ctx, n, "nft", "list", "tables")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(tables), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" && f[2] == "kube-proxy" {
			left = append(left, "nft "+f[1]+" kube-proxy")
		}
	}
	return left, nil
}

func kubeProxyRules(dump string) []string {
	var left []string
	table := ""
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			if chain := strings.Fields(line[1:])[0]; IsKubeProxyChain(chain) {
				left = append(left, table+" "+chain)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if IsKubeProxyChain(f[1]) {
				continue // part of a chain already listed
			}
			if i := slices.Index(f, "-j"); i >= 0 && i+1 < len(f) && IsKubeProxyChain(f[i+1]) {
				left = append(left, table+" "+f[1]+" -j "+f[i+1])
			}
		}
	}
	return left
}

// Planted are rules the suite plants on a node, in the tables and chains a dataplane
// taking over from kube-proxy rewrites, that are not kube-proxy's and must survive it.
var Planted = []struct{ Table, Chain, Rule string }{
	{"filter", "DPC-PLANTED", "-A DPC-PLANTED -s 192.0.2.1/32 -m comment --comment dpconform-planted -j DROP"},
	{"filter", "FORWARD", "-A FORWARD -s 192.0.2.2/32 -m comment --comment dpconform-planted -j DROP"},
	{"nat", "DPC-PLANTED-NAT", "-A DPC-PLANTED-NAT -s 192.0.2.3/32 -m comment --comment dpconform-planted -j RETURN"},
	{"nat", "PREROUTING", "-A PREROUTING -s 192.0.2.3/32 -m comment --comment dpconform-planted -j DPC-PLANTED-NAT"},
}

// Plant adds the Planted rules to node n (from TEST-NET-1 sources, which no flow of a
// run uses).
func Plant(ctx context.Context, n topologies.Node) error {
	for _, p := range Planted {
		if !isBuiltin(p.Chain) {
			if out, err := topologies.Output(ctx, n, "iptables", "-w", "5", "-t", p.Table, "-N", p.Chain); err != nil {
				return fmt.Errorf("plant chain %s/%s on %s: %w: %s", p.Table, p.Chain, n.Name(), err, out)
			}
		}
	}
	for _, p := range Planted {
		args := append([]string{"-w", "5", "-t", p.Table}, strings.Fields(p.Rule)...)
		if out, err := topologies.Output(ctx, n, "iptables", args...); err != nil {
			return fmt.Errorf("plant %q on %s: %w: %s", p.Rule, n.Name(), err, out)
		}
	}
	return nil
}

// MissingPlanted lists the Planted rules node n no longer holds.
func MissingPlanted(ctx context.Context, n topologies.Node) ([]string, error) {
	dump, err := topologies.Output(ctx, n, "iptables-save")
	if err != nil {
		return nil, err
	}
	return missingPlanted(string(dump)), nil
}

func missingPlanted(dump string) []string {
	have := map[string]bool{}
	table := ""
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, "*") {
			table = line[1:]
		}
		// iptables-save quotes nothing here: the planted comments have no spaces.
		have[table+" "+strings.Join(strings.Fields(line), " ")] = true
	}
	var missing []string
	for _, p := range Planted {
		if !have[p.Table+" "+p.Rule] {
			missing = append(missing, p.Table+" "+p.Rule)
		}
	}
	return missing
}

func isBuiltin(chain string) bool {
	switch chain {
	case "INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING":
		return true
	}
	return false
}
