// Package kubeproxy is the kube-proxy fixture: it runs the real kube-proxy (iptables or
// nftables mode) inside one node's network namespace, tells when its first sync is
// done, collects its diagnostics and removes everything it programmed.
//
// The suite uses it in two ways: through drivers/kube-proxy-driver, which makes
// kube-proxy an implementation under test like any other (a Services-only dataplane),
// and directly, to put kube-proxy on a node before a spec switches the node to another
// dataplane. docs/kube-proxy.md records how kube-proxy is configured and what it does
// across restarts.
//
// The fixture never touches the host outside the node's network namespace: it refuses
// to run without one, keeps kube-proxy's hands off the host-global conntrack settings
// (see Config.Render), and denies it modprobe (see Fixture.Start).
package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/driver/daemon"
	"github.com/dpconform/dpconform/driver/innetns"
)

// Names of the fixture's files in Fixture.Dir.
const (
	ConfigFile = "kube-proxy.conf"
	LogFile    = "kube-proxy.log"
	PIDFile    = "kube-proxy.pid"
	// guardDir holds the modprobe that kube-proxy finds first on its PATH.
	guardDir = "kube-proxy-path"
)

// ErrRunning is returned by Start when kube-proxy already runs on the node in another
// mode.
var ErrRunning = errors.New("kube-proxy already runs on this node")

// Fixture runs one kube-proxy in one node's network namespace. Its state lives in files
// under Dir, so that separate processes (one driver call each) manage the same
// kube-proxy.
type Fixture struct {
	// Binary is the kube-proxy executable.
	Binary string
	// NetNS is the path of the node's network namespace. Required: the fixture never
	// runs kube-proxy in the caller's own namespace.
	NetNS string
	// Dir holds the configuration, log and PID file; private to the node, kept across
	// restarts (the driver contract's DPC_STATE_DIR).
	Dir string
	// Config is kube-proxy's configuration.
	Config Config
	// Env is added to kube-proxy's environment, e.g. DPC_RUN=<run ID> so that the
	// topology's cleanup finds a kube-proxy that outlived its test.
	Env []string
	// StartIn, if set, starts kube-proxy's process in the node (the suite's netns
	// topology starts it in the node's mount and cgroup namespaces too, so that it shares the node's xtables lock
	// with the node's other agents). Nil starts it in NetNS from here, as a driver
	// call that already runs inside the node does.
	StartIn func(*exec.Cmd) error
}

// Check reports a fixture that cannot work, naming the fix.
func (f *Fixture) Check() error {
	var errs []error
	if f.NetNS == "" {
		errs = append(errs, errors.New("no network namespace: the fixture runs kube-proxy only inside a node's network namespace (a netns topology); on kind, the cluster's own kube-proxy DaemonSet is the one to use"))
	} else if _, err := os.Stat(f.NetNS); err != nil {
		errs = append(errs, fmt.Errorf("network namespace %s: %w", f.NetNS, err))
	}
	if st, err := os.Stat(f.Dir); f.Dir == "" || err != nil || !st.IsDir() {
		errs = append(errs, fmt.Errorf("state directory %q is not a directory", f.Dir))
	}
	if err := checkExecutable(f.Binary); err != nil {
		errs = append(errs, err)
	}
	if _, err := f.Config.withDefaults(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if path == "" || err != nil {
		return fmt.Errorf("kube-proxy binary %q not found (run `make control-plane` to build it, or set DPC_KUBE_PROXY)", path)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("kube-proxy binary %s is not an executable file (set DPC_KUBE_PROXY to kube-proxy's path)", path)
	}
	return nil
}

// Path returns the path of one of the fixture's files (ConfigFile, LogFile, PIDFile).
func (f *Fixture) Path(name string) string { return filepath.Join(f.Dir, name) }

// requiredTools are what kube-proxy execs in each mode. nftables mode also runs
// iptables once, best-effort, to remove an iptables-mode predecessor's rules.
var requiredTools = map[Mode][]string{
	IPTables: {"iptables", "iptables-save", "iptables-restore"},
	NFTables: {"nft"},
}

// Start starts kube-proxy in the node's network namespace, in its own session, with
// stdout and stderr appended to LogFile, and returns its PID without waiting for it to
// be ready. If kube-proxy already runs in the same mode, Start returns its PID; in
// another mode, ErrRunning.
//
// kube-proxy finds a modprobe on its PATH that refuses to load anything: in nftables
// mode it runs `modprobe ip_vs` to look for an ipvs predecessor to clean up, and a
// loaded module would change the whole host.
func (f *Fixture) Start(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("start kube-proxy: %w", err)
	}
	if err := f.Check(); err != nil {
		return 0, err
	}
	cfg, _ := f.Config.withDefaults()
	if pid := f.PID(); pid != 0 {
		data, err := os.ReadFile(f.Path(ConfigFile))
		if err != nil {
			return 0, fmt.Errorf("kube-proxy runs (pid %d) but its configuration is unreadable: %w", pid, err)
		}
		running, err := modeOf(data)
		if err != nil {
			return 0, err
		}
		if running != cfg.Mode {
			return 0, fmt.Errorf("%w in %s mode (pid %d); stop it before starting it in %s mode", ErrRunning, running, pid, cfg.Mode)
		}
		return pid, nil
	}
	for _, tool := range requiredTools[cfg.Mode] {
		if _, err := exec.LookPath(tool); err != nil {
			return 0, fmt.Errorf("kube-proxy in %s mode needs %s: %w (install the iptables and nftables packages, e.g. `make deps`)", cfg.Mode, tool, err)
		}
	}
	data, err := cfg.Render()
	if err != nil {
		return 0, err
	}
	// kube-proxy watches its configuration file and exits when it changes, so it is
	// written only here, while no kube-proxy of this node runs.
	if err := os.WriteFile(f.Path(ConfigFile), data, 0o644); err != nil {
		return 0, fmt.Errorf("write kube-proxy configuration: %w", err)
	}
	env, err := f.environ()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(f.Binary, f.args()...)
	cmd.Env = env
	launch := daemon.InNetNS(f.NetNS)
	if f.StartIn != nil {
		launch = f.StartIn
	}
	return f.daemon().Start(cmd, launch)
}

// daemon is the node's kube-proxy process: its PID and log files, and the
// configuration path that tells it from any other process.
func (f *Fixture) daemon() daemon.Daemon {
	return daemon.Daemon{Name: "kube-proxy", Dir: f.Dir, PIDFile: PIDFile, LogFile: LogFile, Identity: f.args()}
}

// args is kube-proxy's command line. The configuration path in it is also how PID
// tells this node's kube-proxy from any other process.
func (f *Fixture) args() []string { return []string{"--config=" + f.Path(ConfigFile)} }

// environ is kube-proxy's environment: ours with the modprobe guard first on PATH.
func (f *Fixture) environ() ([]string, error) {
	dir := f.Path(guardDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create kube-proxy's PATH directory: %w", err)
	}
	const guard = "#!/bin/sh\n" +
		"echo \"modprobe $*: refused by the dpconform kube-proxy fixture, which loads no kernel module into the host\" >&2\n" +
		"exit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "modprobe"), []byte(guard), 0o755); err != nil {
		return nil, fmt.Errorf("write kube-proxy's modprobe guard: %w", err)
	}
	var env []string
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+dir+string(os.PathListSeparator)+path)
	return append(env, f.Env...), nil
}

// PID returns the PID of this node's running kube-proxy, or 0. A zombie (exited, not
// yet reaped by a parent that may never reap it) counts as exited, and a reused PID is
// not kube-proxy.
func (f *Fixture) PID() int { return f.daemon().PID() }

// Stop stops kube-proxy gracefully (SIGTERM) and returns once it and the rest of its
// process group (proc.StopGroup) have exited.
func (f *Fixture) Stop(ctx context.Context) error {
	return f.daemon().Stop(ctx, syscall.SIGTERM)
}

// Kill crashes kube-proxy (SIGKILL to its process group: it leads its own session)
// and returns once it and its children have exited: an iptables-restore of a sync
// in progress dies with it, as in a crashed container.
func (f *Fixture) Kill(ctx context.Context) error {
	return f.daemon().Kill(ctx)
}

// WaitReady polls Status until kube-proxy is ready, and fails early if it exits.
func (f *Fixture) WaitReady(ctx context.Context) error {
	var st Status
	for {
		st = f.Status(ctx)
		if st.Ready() {
			return nil
		}
		if !st.Running() {
			return fmt.Errorf("kube-proxy is not running (%s); its log ends:\n%s", st.Detail, f.LogTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-proxy (pid %d) is not ready (%s): %w; its log ends:\n%s", st.PID, st.Detail, ctx.Err(), f.LogTail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogTail returns the last n lines of the log.
func (f *Fixture) LogTail(n int) string {
	data, err := os.ReadFile(f.Path(LogFile))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Cleanup kills kube-proxy, runs `kube-proxy --cleanup` in the node's namespace (it
// removes the rules of every mode), removes the one chain that --cleanup leaves behind
// (see RemoveLeftovers), checks that nothing of kube-proxy's remains, and removes the
// fixture's files.
func (f *Fixture) Cleanup(ctx context.Context) error {
	if f.NetNS == "" {
		return errors.New("no network namespace: the fixture cleans up only inside a node's network namespace")
	}
	if err := f.Kill(ctx); err != nil {
		return err
	}
	if err := checkExecutable(f.Binary); err != nil {
		return err
	}
	env, err := f.environ()
	if err != nil {
		return err
	}
	var out []byte
	err = innetns.Do(f.NetNS, func() error {
		cmd := exec.CommandContext(ctx, f.Binary, "--cleanup", "--v=2")
		cmd.Env = env
		out, err = cmd.CombinedOutput()
		return err
	})
	f.appendLog("kube-proxy --cleanup", out)
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup in %s: %w: %s", f.NetNS, err, lastLines(out, 10))
	}
	if err := f.RemoveLeftovers(ctx); err != nil {
		return err
	}
	left, err := f.Rules(ctx)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("kube-proxy's rules remain after cleanup: %s", strings.Join(left, ", "))
	}
	var errs []error
	for _, p := range []string{f.Path(PIDFile), f.Path(ConfigFile), f.Path(LogFile), f.Path(guardDir)} {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (f *Fixture) appendLog(what string, out []byte) {
	log, err := os.OpenFile(f.Path(LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer log.Close()
	fmt.Fprintf(log, "---- kube-proxy fixture: %s %s\n%s", what, time.Now().Format(time.RFC3339Nano), out)
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
