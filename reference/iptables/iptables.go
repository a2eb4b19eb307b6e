// Package iptables programs the node's iptables for the reference dataplane: accepts in
// INPUT and FORWARD for packets its datapath has handled, and for fallthrough packets of
// flows the Linux stack's conntrack knows (flows that predate the datapath). Rules are
// applied in one iptables-restore transaction, as kube-proxy does.
package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Chain is the chain the reference owns in the filter table.
const Chain = "REFDP-ACCEPT"

// Marks are the datapath's packet marks (bpf.MarkSeen etc.), passed in so that this
// package does not depend on the datapath's.
type Marks struct {
	Seen, Fallthrough, Mask uint32
}

// Rules renders the iptables-restore input that (re)writes Chain.
func Rules(m Marks) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*filter\n:%s - [0:0]\n-F %s\n", Chain, Chain)
	fmt.Fprintf(&b, "-A %s -m mark --mark %#x/%#x -m comment --comment \"refdp: handled by BPF\" -j ACCEPT\n", Chain, m.Seen, m.Mask)
	fmt.Fprintf(&b, "-A %s -m mark --mark %#x/%#x -m conntrack --ctstate ESTABLISHED,RELATED -m comment --comment \"refdp: fallthrough of a flow the stack knows\" -j ACCEPT\n", Chain, m.Fallthrough, m.Mask)
	b.WriteString("COMMIT\n")
	return b.String()
}

// Ensure writes Chain and makes it the first rule of INPUT and FORWARD.
func Ensure(ctx context.Context, m Marks) error {
	if err := run(ctx, []byte(Rules(m)), "iptables-restore", "--noflush", "-w", "5"); err != nil {
		return err
	}
	for _, parent := range []string{"INPUT", "FORWARD"} {
		if err := run(ctx, nil, "iptables", "-w", "5", "-C", parent, "-j", Chain); err == nil {
			continue
		}
		if err := run(ctx, nil, "iptables", "-w", "5", "-I", parent, "1", "-j", Chain); err != nil {
			return err
		}
	}
	return nil
}

// Remove deletes the jumps and Chain. It is idempotent.
func Remove(ctx context.Context) error {
	for _, parent := range []string{"INPUT", "FORWARD"} {
		for run(ctx, nil, "iptables", "-w", "5", "-D", parent, "-j", Chain) == nil {
		}
	}
	if run(ctx, nil, "iptables", "-w", "5", "-L", Chain, "-n") != nil {
		return nil
	}
	if err := run(ctx, nil, "iptables", "-w", "5", "-F", Chain); err != nil {
		return err
	}
	return run(ctx, nil, "iptables", "-w", "5", "-X", Chain)
}

func run(ctx context.Context, stdin []byte, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, lerr := exec.LookPath(name); lerr != nil {
			return fmt.Errorf("%s not found: install iptables (`make deps`)", name)
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
