package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/driver/daemon"
	"github.com/dpconform/dpconform/driver/innetns"
	"github.com/dpconform/dpconform/driver/skel"
)

// Names of the agent's files in the node's state directory.
const (
	LogFile = "kube-router.log"
	PIDFile = "kube-router.pid"
)

// serviceCIDR is the netns topology's Service range (topologies/netns). kube-router
// lets pod traffic to it pass its INPUT chain (a VIP is local on an IPVS node); it
// must be the cluster's, not kube-router's default 10.96.0.0/12.
const serviceCIDR = "10.96.0.0/16"

// healthAddr is kube-router's health server (it listens on every address of the
// node's namespace, on its default port): reachable only inside the run.
const healthAddr = "127.0.0.1:20244"

// agent is kube-router on one node. Its state lives in files under Dir, so that
// separate driver calls manage the same process.
type agent struct {
	Binary     string
	NetNS      string // the node's network namespace; kube-router never runs outside one
	Dir        string // the node's state directory (DPC_STATE_DIR)
	Node       string // the node's name, its Node object
	Kubeconfig string
}

// identity are the arguments by which PID tells this node's kube-router from any other
// process: the node's name and the run's kubeconfig, together unique to a node of a
// run.
func (a *agent) identity() []string {
	return []string{"--hostname-override=" + a.Node, "--kubeconfig=" + a.Kubeconfig}
}

// args is kube-router's command line: the network policy controller and nothing else.
func (a *agent) args() []string {
	return append(a.identity(),
		"--run-firewall=true",
		"--run-router=false",
		"--run-service-proxy=false",
		"--run-loadbalancer=false",
		// The pods are the topology's (ptp + host-local); kube-router writes no CNI
		// configuration (it would only with --run-router).
		"--enable-cni=false",
		"--service-cluster-ip-range="+serviceCIDR,
		"--metrics-port=0",
		// V(1) logs the start and end of every full sync: readiness reads them.
		"--v=1",
	)
}

func (a *agent) path(name string) string { return filepath.Join(a.Dir, name) }

// Start starts kube-router in the node's network namespace, in its own session, with
// stdout and stderr appended to LogFile, and returns its PID without waiting for it to
// be ready. If it already runs, Start returns its PID.
func (a *agent) Start(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if a.NetNS == "" {
		return 0, errors.New("no network namespace: kube-router runs only inside a node's network namespace")
	}
	if pid := a.PID(); pid != 0 {
		return pid, nil
	}
	// What kube-router execs: a missing one is found only at its first sync, as a
	// fatal error in its log.
	for _, tool := range []string{"iptables", "iptables-save", "iptables-restore", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return 0, fmt.Errorf("kube-router needs %s: %w (install the iptables and ipset packages, e.g. `make deps`)", tool, err)
		}
	}
	cmd := exec.Command(a.Binary, a.args()...)
	// NODE_NAME is the first name kube-router looks its Node up by, before the host's
	// hostname (which a netns node shares with the host) and --hostname-override.
	cmd.Env = append(os.Environ(), "NODE_NAME="+a.Node)
	return a.daemon().Start(cmd, daemon.InNetNS(a.NetNS))
}

// daemon is the kube-router process of the node: its PID and log files in Dir, and
// the arguments that tell it from any other process.
func (a *agent) daemon() daemon.Daemon {
	return daemon.Daemon{Name: "kube-router", Dir: a.Dir, PIDFile: PIDFile, LogFile: LogFile, Identity: a.identity()}
}

// PID returns the PID of this node's running kube-router, or 0. A zombie counts as
// exited, and a reused PID is not kube-router.
func (a *agent) PID() int { return a.daemon().PID() }

// Status is what kube-router says about itself.
//
// Its /healthz is no readiness: it answers 200 from the moment the process starts
// (the health controller begins healthy), and a controller's heartbeat is sent at the
// start of a sync, not at its end. Readiness is the log instead: kube-router logs, at
// V(1), "Starting sync of iptables" and "sync iptables took" around every full sync,
// and "Aborting sync" when one fails; the first full sync runs after its informers
// have synced, so one that completed means the node enforces every policy of the
// API. Only what the current process logged counts (from its start's log offset):
// rules a previous process left prove nothing about this one.
type Status struct {
	PID     int
	Healthz bool
	Synced  bool // a full sync of this process completed
	Detail  string
}

// Ready reports whether kube-router runs, answers its health check and has completed
// a full sync.
func (s Status) Ready() bool { return s.PID != 0 && s.Healthz && s.Synced }

// Status asks kube-router whether it is ready. What it could not learn is in Detail.
func (a *agent) Status(ctx context.Context) Status {
	st := Status{PID: a.PID()}
	if st.PID == 0 {
		st.Detail = "kube-router does not run"
		return st
	}
	st.Synced, st.Detail = syncedSince(a.path(LogFile), a.daemon().LogOffset())
	if !st.Synced {
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, _, err := innetns.HTTPGet(ctx, a.NetNS, healthAddr, "/healthz")
	switch {
	case err != nil:
		st.Detail = "healthz: " + err.Error()
	case code != http.StatusOK:
		st.Detail = fmt.Sprintf("healthz answered %d", code)
	default:
		st.Healthz = true
	}
	return st
}

// syncedSince reports whether the log, from offset on, shows a full sync that
// completed without aborting.
func syncedSince(logPath string, offset int64) (bool, string) {
	f, err := os.Open(logPath)
	if err != nil {
		return false, "log: " + err.Error()
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false, "log: " + err.Error()
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	inSync, aborted, syncs := false, false, 0
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "Starting sync of iptables with version"):
			inSync, aborted = true, false
			syncs++
		case strings.Contains(line, "Aborting sync"):
			aborted = true
		case strings.Contains(line, "sync iptables took"):
			if inSync && !aborted {
				return true, ""
			}
			inSync = false
		}
	}
	if syncs == 0 {
		return false, "no full sync started yet (waiting for the Node object and informers)"
	}
	return false, fmt.Sprintf("%d full sync(s) started, none completed", syncs)
}

// Stop stops kube-router gracefully (SIGTERM) and returns once it and the rest of its
// process group (proc.StopGroup) have exited. It removes nothing on the way out: its
// rules keep enforcing until a successor rewrites them or Cleanup removes them.
func (a *agent) Stop(ctx context.Context) error {
	return a.daemon().Stop(ctx, syscall.SIGTERM)
}

// Kill crashes kube-router (SIGKILL to its process group: it leads its own session)
// and returns once it and its children have exited. A crash in a container takes the
// children too; an iptables-restore of a sync in progress left running would write
// kube-router's chains back after Cleanup removed them.
func (a *agent) Kill(ctx context.Context) error {
	return a.daemon().Kill(ctx)
}

// kube-router's names in the filter table and among the ipsets (netpol, v2.1.0):
// its top-level chains KUBE-ROUTER-INPUT, -FORWARD and -OUTPUT, the default chain
// KUBE-NWPLCY-DEFAULT, a KUBE-NWPLCY-<hash> chain per policy and a KUBE-POD-FW-<hash>
// chain per local pod; KUBE-SRC-/KUBE-DST-<hash> sets per policy, TMP-<hash> sets
// during a swap, and inet6: before each for IPv6.
var (
	chainPrefixes = []string{"KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-"}
	setPrefixes   = []string{"KUBE-SRC-", "KUBE-DST-", "TMP-"}
)

func isChain(name string) bool {
	return slices.ContainsFunc(chainPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

func isSet(name string) bool {
	name = strings.TrimPrefix(name, "inet6:")
	return slices.ContainsFunc(setPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

var iptablesFamilies = []string{"iptables", "ip6tables"}

// Programmed lists what of kube-router's is in the node: its chains as "iptables
// filter KUBE-ROUTER-FORWARD", its ipsets as "ipset KUBE-SRC-...". Empty means
// kube-router left nothing.
func (a *agent) Programmed(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	for _, fam := range iptablesFamilies {
		dump, err := a.run(ctx, nil, fam+"-save")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		table := ""
		for _, line := range strings.Split(string(dump), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":"):
				if c := strings.Fields(line[1:])[0]; isChain(c) {
					out = append(out, fam+" "+table+" "+c)
				}
			}
		}
	}
	sets, err := a.run(ctx, nil, "ipset", "list", "-n")
	if err != nil {
		errs = append(errs, err)
	}
	for _, s := range strings.Fields(string(sets)) {
		if isSet(s) {
			out = append(out, "ipset "+s)
		}
	}
	return out, errors.Join(errs...)
}

// Cleanup kills kube-router, removes its chains (and the jumps to them from the
// built-in chains) in one iptables-restore transaction per family, destroys its
// ipsets, checks that nothing of it remains, and removes its files.
//
// It does not use `kube-router --cleanup-config`: in v2.1.0 that builds an empty
// network policy controller whose clean-up iterates over no iptables or ipset handler,
// so it removes none of the firewall's rules; and it runs the service proxy's and
// router's clean-up too, which touch IPVS and links this driver never asked for.
func (a *agent) Cleanup(ctx context.Context) error {
	if a.NetNS == "" {
		return errors.New("no network namespace: the driver cleans up only inside a node's network namespace")
	}
	if err := a.Kill(ctx); err != nil {
		return err
	}
	var errs []error
	for _, fam := range iptablesFamilies {
		if err := a.removeChains(ctx, fam); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.destroySets(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left, err := a.Programmed(ctx)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("kube-router's rules remain after cleanup: %s", strings.Join(left, ", "))
	}
	if err := a.daemon().Remove(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeChains removes kube-router's chains from fam's filter table (the only table it
// programs): the jumps to them from other chains first, then their rules, then the
// chains, in one transaction.
func (a *agent) removeChains(ctx context.Context, fam string) error {
	dump, err := a.run(ctx, nil, fam+"-save", "-t", "filter")
	if err != nil {
		return err
	}
	var deletes, flushes, removes strings.Builder
	for _, line := range strings.Split(string(dump), "\n") {
		if strings.HasPrefix(line, ":") {
			if c := strings.Fields(line[1:])[0]; isChain(c) {
				fmt.Fprintf(&flushes, "-F %s\n", c)
				fmt.Fprintf(&removes, "-X %s\n", c)
			}
			continue
		}
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, _, _ := strings.Cut(rest, " ")
		if isChain(chain) {
			continue // flushed with its chain
		}
		if f := strings.Fields(rest); slices.ContainsFunc(f, isChain) {
			deletes.WriteString("-D " + rest + "\n")
		}
	}
	if removes.Len() == 0 && deletes.Len() == 0 {
		return nil
	}
	script := "*filter\n" + deletes.String() + flushes.String() + removes.String() + "COMMIT\n"
	if _, err := a.run(ctx, []byte(script), fam+"-restore", "--noflush"); err != nil {
		return fmt.Errorf("remove kube-router's chains: %w", err)
	}
	return nil
}

// destroySets destroys kube-router's ipsets; a set is destroyed only once no rule
// refers to it, so this runs after removeChains.
func (a *agent) destroySets(ctx context.Context) error {
	sets, err := a.run(ctx, nil, "ipset", "list", "-n")
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range strings.Fields(string(sets)) {
		if !isSet(s) {
			continue
		}
		if _, err := a.run(ctx, nil, "ipset", "destroy", s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Diagnostics writes what explains a failed spec into dir and returns the files'
// names: kube-router's log and status, the node's filter rules with counters, its
// ipsets, conntrack table, addresses and routes.
func (a *agent) Diagnostics(ctx context.Context, dir string) ([]string, error) {
	d := &skel.Diagnostics{Dir: dir}
	d.Copy(LogFile, a.path(LogFile))
	st := a.Status(ctx)
	d.Write("status.txt", fmt.Appendf(nil, "pid %d\nhealthz %v\nsynced %v\nready %v\n%s\n", st.PID, st.Healthz, st.Synced, st.Ready(), st.Detail), nil)
	for _, c := range []struct {
		file string
		cmd  []string
	}{
		{"iptables-save.txt", []string{"iptables-save", "-c"}},
		{"ip6tables-save.txt", []string{"ip6tables-save", "-c"}},
		{"ipset.txt", []string{"ipset", "list"}},
		{"conntrack.txt", []string{"conntrack", "-L"}},
		{"addresses.txt", []string{"ip", "address"}},
		{"routes.txt", []string{"ip", "route"}},
	} {
		out, err := a.run(ctx, nil, c.cmd[0], c.cmd[1:]...)
		d.Write(c.file, out, err)
	}
	return d.Files()
}

// run runs name with args inside the node's network namespace and returns its
// standard output; a failed run's error holds what it said on standard error.
func (a *agent) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	out, err := innetns.Output(ctx, a.NetNS, stdin, name, args...)
	if notRun := (*exec.Error)(nil); err != nil && !errors.As(err, &notRun) {
		err = fmt.Errorf("%s %s in %s: %w", name, strings.Join(args, " "), a.NetNS, err)
	}
	return out, err
}
