package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/dpconform/dpconform/driver/skel"
)

// Cleanup kills Felix, removes what it programmed in the node (Programmed), checks
// that nothing of it remains, undoes the driver's binds and removes its files.
//
// Felix has no clean-up of its own to call: calico-node removes its BPF state only
// when it is switched out of eBPF mode, by a Felix that keeps running.
func (f *felix) Cleanup(ctx context.Context) error {
	if err := f.Kill(ctx); err != nil {
		return err
	}
	if err := inNode(f.BPFFS); err != nil {
		return err
	}
	cgroup, err := cgroup2Dir()
	if err != nil {
		return err
	}
	if err := unprogram(ctx, f.BPFFS, cgroup); err != nil {
		return err
	}
	// The kernel releases a link whose last pin is removed from a work queue, a moment
	// later: what is still attached then is given up to 5 s to go.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		if left, err = Programmed(ctx, f.NetNS, f.BPFFS, cgroup); err != nil {
			return err
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("state of Calico's remains in the node 5 s after cleanup: %s", strings.Join(left, ", "))
	}
	if err := removeBinds(f.binds()); err != nil {
		return err
	}
	return os.RemoveAll(f.Dir)
}

// Diagnostics writes what explains a failed spec into dir and returns the files'
// names: Felix's log and status, its BPF maps as calico-bpf dumps them, the node's
// addresses, routes, links and rules.
func (f *felix) Diagnostics(ctx context.Context, dir string) ([]string, error) {
	d := &skel.Diagnostics{Dir: dir}
	d.Copy(LogFile, f.path(LogFile))
	st, why := f.status(ctx)
	d.Write("status.txt", fmt.Appendf(nil, "running %v\nready %v\n%s\n", st.Running, st.Ready, why), nil)
	for _, c := range []struct {
		file string
		cmd  []string
	}{
		{"calico-bpf-nat.txt", []string{f.Build.CalicoBPF(), "nat", "dump"}},
		{"calico-bpf-ifstate.txt", []string{f.Build.CalicoBPF(), "ifstate", "dump"}},
		{"calico-bpf-conntrack.txt", []string{f.Build.CalicoBPF(), "conntrack", "dump"}},
		{"calico-bpf-routes.txt", []string{f.Build.CalicoBPF(), "routes", "dump"}},
		{"addresses.txt", []string{"ip", "address"}},
		{"routes.txt", []string{"ip", "route"}},
		{"tc.txt", []string{"tc", "filter", "show", "dev", dataInterface, "ingress"}},
		{"iptables-save.txt", []string{"iptables-save", "-c"}},
		{"ipset.txt", []string{"ipset", "list"}},
	} {
		out, err := exec.CommandContext(ctx, c.cmd[0], c.cmd[1:]...).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%s: %w", strings.Join(c.cmd, " "), err)
		}
		d.Write(c.file, out, err)
	}
	return d.Files()
}
