package kind

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kubeletSysctls are the host-wide settings a kubelet writes at its start (its
// container manager's node set-up): no namespace contains them, so a kind node's
// kubelet writes the host's.
var kubeletSysctls = []string{"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops"}

// hostState is the value of each of kubeletSysctls before the cluster was made.
type hostState struct{ values map[string]string }

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

func snapshotHost() *hostState {
	h := &hostState{values: map[string]string{}}
	for _, k := range kubeletSysctls {
		if data, err := os.ReadFile(sysctlPath(k)); err == nil {
			h.values[k] = strings.TrimSpace(string(data))
		}
	}
	return h
}

// restore writes back each setting that changed, and says which.
func (h *hostState) restore(logf func(string, ...any)) error {
	var errs []error
	for k, was := range h.values {
		data, err := os.ReadFile(sysctlPath(k))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		now := strings.TrimSpace(string(data))
		if now == was {
			continue
		}
		if err := os.WriteFile(sysctlPath(k), []byte(was), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s=%s (the kubelets set %s): %w", k, was, now, err))
			continue
		}
		logf("kind: the kubelets set the host's %s %s -> %s; restored", k, was, now)
	}
	return errors.Join(errs...)
}
