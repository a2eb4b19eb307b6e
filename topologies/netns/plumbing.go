package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted (as `ip netns` does).
const netnsDir = "/var/run/netns"

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNamedNS creates a named network namespace without leaving the calling thread
// in it, and returns a handle to it.
func createNamedNS(name string) (netns.NsHandle, error) {
	if _, err := os.Stat(netnsPath(name)); err == nil {
		return netns.None(), fmt.Errorf("network namespace %s already exists: a killed run left it behind; run `dpconform cleanup`", name)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), fmt.Errorf("get current network namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is stuck in the new namespace: keep it locked so that the Go
		// runtime ends it with this goroutine instead of reusing it.
		if err == nil {
			h.Close()
		}
		return netns.None(), fmt.Errorf("return to the original network namespace after creating %s: %w", name, serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		return netns.None(), fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return h, nil
}

// deleteNamedNS removes a named namespace's bind mount. The namespace itself goes away
// once no process and no open handle holds it.
func deleteNamedNS(name string) error {
	if _, err := os.Stat(netnsPath(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Unmount, then remove, as `ip netns delete` does. A file that is no mount point
	// (its mount already gone, say with a killed run's mount namespace) is only
	// removed.
	path := netnsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: unmount %s: %w", name, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// startIn starts cmd with its network namespace set to the one at path (a forked
// child inherits the namespace of the thread that forks it), in the cgroup v2
// directory cgroup unless that is "". Unless the caller set one, the child gets
// SIGKILL when this process dies, so a killed suite leaves no probe behind.
func startIn(path, cgroup string, cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	return startInCgroup(cgroup, cmd, func() error {
		return ns.WithNetNSPath(path, func(ns.NetNS) error { return cmd.Start() })
	})
}

// inNS runs fn with the calling goroutine's thread in the namespace at path.
func inNS(path string, fn func() error) error {
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// writeSysctls writes /proc/sys values inside the namespace at path.
func writeSysctls(path string, kv map[string]string) error {
	return inNS(path, func() error {
		for k, v := range kv {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", k, v, err)
			}
		}
		return nil
	})
}

// linkUpWithAddr sets a link up, optionally with an address.
func linkUpWithAddr(h *netlink.Handle, name string, addr netip.Prefix) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if addr.IsValid() {
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
			return fmt.Errorf("add %s to %s: %w", addr, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// explainLinkErr turns the kernel's terse answers into a message naming the fix.
func explainLinkErr(kind, name string, err error) error {
	switch {
	case errors.Is(err, syscall.EEXIST):
		return fmt.Errorf("create %s %s: a link of that name already exists (a killed run left it behind; run `dpconform cleanup`): %w", kind, name, err)
	case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOTSUP):
		return fmt.Errorf("create %s %s: this kernel has no %s link type (load its module, e.g. `modprobe %s`): %w", kind, name, kind, kind, err)
	case errors.Is(err, syscall.EPERM):
		return fmt.Errorf("create %s %s: not permitted; dpconform's netns topology needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): %w", kind, name, err)
	}
	return fmt.Errorf("create %s %s: %w", kind, name, err)
}
