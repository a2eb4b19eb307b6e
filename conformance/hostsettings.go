package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// hostSysctls are the host-wide kernel settings (one per machine, not per network
// namespace) that dataplane agents and kubelets are known to write. An implementation
// runs inside a node, but these it changes for the whole machine; the runner records
// each one a spec's run changed, puts it back where the kernel allows, and says so in
// the report.
var hostSysctls = []string{
	"kernel/unprivileged_bpf_disabled", // Cilium and Calico Felix set it to 1
	"kernel/timer_migration",           // Cilium sets it to 0
	"kernel/panic",                     // kubelet
	"kernel/panic_on_oops",             // kubelet
	"kernel/perf_event_paranoid",
	"kernel/pid_max",
	"kernel/keys/root_maxkeys", // kubelet
	"kernel/keys/root_maxbytes",
	"vm/overcommit_memory", // kubelet
	"vm/max_map_count",
	"fs/inotify/max_user_instances",
	"fs/inotify/max_user_watches",
	"net/core/bpf_jit_enable",
	"net/core/bpf_jit_harden",
	"net/core/bpf_jit_kallsyms",
	"net/core/bpf_jit_limit",
	"net/netfilter/nf_conntrack_max", // kube-proxy; writable only from the host's namespace
}

// sysctlRoot is where the settings are read, and writeSetting how one is written; a
// test replaces both.
var (
	sysctlRoot   = "/proc/sys"
	writeSetting = func(path, v string) error { return os.WriteFile(path, []byte(v), 0o644) }
)

// HostSetting is a host-wide setting a spec's run changed.
type HostSetting struct {
	// Name is the sysctl, dotted (kernel.timer_migration).
	Name   string `json:"name"`
	Before string `json:"before"`
	After  string `json:"after"`
	// Restored says whether the runner put Before back; Note says why not.
	Restored bool   `json:"restored"`
	Note     string `json:"note,omitempty"`
}

// hostSnapshot is the value of each of hostSysctls this host has.
type hostSnapshot map[string]string

func snapshotHost() hostSnapshot {
	s := hostSnapshot{}
	for _, k := range hostSysctls {
		if v, err := os.ReadFile(filepath.Join(sysctlRoot, k)); err == nil {
			s[k] = strings.TrimSpace(string(v))
		}
	}
	return s
}

// restore compares the host with s, writes back what changed, and returns what did.
func (s hostSnapshot) restore() []HostSetting {
	var out []HostSetting
	for _, k := range hostSysctls {
		before, ok := s[k]
		if !ok {
			continue
		}
		path := filepath.Join(sysctlRoot, k)
		v, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		after := strings.TrimSpace(string(v))
		if after == before {
			continue
		}
		h := HostSetting{Name: strings.ReplaceAll(k, "/", "."), Before: before, After: after}
		err = writeSetting(path, before)
		if err == nil {
			if v, rerr := os.ReadFile(path); rerr == nil && strings.TrimSpace(string(v)) == before {
				h.Restored = true
			} else {
				err = fmt.Errorf("reads %q after writing %q", strings.TrimSpace(string(v)), before)
			}
		}
		if err != nil {
			h.Note = "could not restore: " + err.Error()
			if k == "kernel/unprivileged_bpf_disabled" && after == "1" {
				h.Note = "the kernel allows no way back from 1 before a reboot (" + err.Error() + ")"
			}
		}
		out = append(out, h)
	}
	return out
}

// String is one line for a log or a report.
func (h HostSetting) String() string {
	s := fmt.Sprintf("%s %s -> %s", h.Name, h.Before, h.After)
	if h.Restored {
		return s + " (restored)"
	}
	return s + " (" + h.Note + ")"
}
