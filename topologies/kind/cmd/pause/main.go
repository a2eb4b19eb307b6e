// Command pause is the sandbox ("pause") container of the kind node image's pods: the
// process that holds a pod's namespaces. kubelet and containerd name it by the tags of
// registry.k8s.io/pause; the node image is built offline, so it is this program, built
// static, in an image of its own (topologies/kind/nodeimage). As PID 1 of the pod's
// PID namespace it reaps orphans, and it exits on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
