// Command refdp is the reference dataplane's agent. It runs inside a node's network
// namespace: `refdp run` programs the node until SIGTERM and leaves the datapath in
// place; `refdp cleanup` removes it all; `refdp dump` prints the datapath's maps.
//
// One binary holds both versions of refdp, v1 and v2 (`run --version`), which differ
// in the format of their conntrack map's values (v2 counts packets and bytes per
// entry; bpf.ConntrackFormat). A start with another version or `--conntrack-size`
// than the running datapath's migrates the conntrack map, in either direction: an
// upgrade from v1 to v2, and a downgrade from v2 to v1 (which drops the counters).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/reference/agent"
	"github.com/dpconform/dpconform/reference/faults"
	"github.com/dpconform/dpconform/reference/iptables"
)

const usage = `usage:
  refdp run --node NAME --kubeconfig PATH --bpffs DIR --state-dir DIR [--version v1|v2] [--conntrack-size N] [--workload-interface-prefix P] [--fault NAME ...]
  refdp cleanup --bpffs DIR
  refdp dump --bpffs DIR
`

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// pinDir is where refdp pins, inside the node's bpffs.
func pinDir(bpffs string) string { return filepath.Join(bpffs, "refdp") }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "cleanup":
		err = cleanup(os.Args[2:])
	case "dump":
		err = dump(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "refdp: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "refdp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var cfg agent.Config
	var bpffs string
	var fl multiFlag
	var ctSize uint
	var version string
	fs.StringVar(&cfg.Node, "node", "", "name of this node's Node object")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig for the API server")
	fs.StringVar(&bpffs, "bpffs", "/sys/fs/bpf", "bpffs mount to pin under (refdp uses its refdp/ directory)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for the status file")
	fs.StringVar(&cfg.HostInterface, "host-interface", "eth0", "the node's interface to the network")
	fs.StringVar(&cfg.WorkloadInterfacePrefix, "workload-interface-prefix", iptables.DefaultWorkloadPrefix,
		"name prefix of pods' host-side interfaces (the ptp CNI plugin's is veth), and of no other interface of the node: the traffic of such an interface is dropped until its programs and policy are attached")
	fs.UintVar(&ctSize, "conntrack-size", 0, fmt.Sprintf("conntrack table capacity, in entries (two a flow); 0: %d", bpf.DefaultConntrackSize))
	fs.StringVar(&version, "version", bpf.DefaultConntrackFormat.String(), "the version of refdp to run, which decides the format of its conntrack map: v1 or v2")
	fs.Var(&fl, "fault", "reintroduce a known defect, for the suite's self-test (repeatable): "+strings.Join(faults.Known(), ", "))
	fs.Parse(args)
	var err error
	if cfg.Faults, err = faults.Parse(fl); err != nil {
		return err
	}
	for _, req := range []struct{ name, val string }{{"--node", cfg.Node}, {"--kubeconfig", cfg.Kubeconfig}, {"--state-dir", cfg.StateDir}} {
		if req.val == "" {
			return fmt.Errorf("%s is required\n%s", req.name, usage)
		}
	}
	if cfg.ConntrackFormat, err = bpf.ParseConntrackFormat(version); err != nil {
		return fmt.Errorf("--version: %w", err)
	}
	if ctSize > 1<<31 {
		return fmt.Errorf("--conntrack-size %d: at most %d entries", ctSize, 1<<31)
	}
	cfg.PinDir = pinDir(bpffs)
	cfg.ConntrackSize = uint32(ctSize)
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", cfg.Node)
	if len(cfg.Faults) > 0 {
		cfg.Log.Warn("faults enabled: this agent is deliberately defective", "faults", cfg.Faults.Names())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, cfg)
}

func cleanup(args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ExitOnError)
	bpffs := fs.String("bpffs", "/sys/fs/bpf", "bpffs mount refdp pinned under")
	fs.Parse(args)
	err := bpf.Remove(pinDir(*bpffs))
	if ierr := iptables.Remove(context.Background()); ierr != nil {
		err = fmt.Errorf("%v; %w", err, ierr)
	}
	return err
}

func dump(args []string) error {
	fs := flag.NewFlagSet("dump", flag.ExitOnError)
	bpffs := fs.String("bpffs", "/sys/fs/bpf", "bpffs mount refdp pinned under")
	fs.Parse(args)
	// Read-only: a dump must not change what it looks at.
	out, err := bpf.Dump(pinDir(*bpffs))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
