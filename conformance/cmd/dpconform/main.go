// Command dpconform is the conformance suite's command line: it reaps what killed runs
// left, brings up a topology by hand, and hosts the helper roles (probes) that the
// suite re-executes inside network namespaces.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/driver/proc"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/cluster"
	"github.com/dpconform/dpconform/topologies/kind"
	"github.com/dpconform/dpconform/topologies/kind/dockerd"
	"github.com/dpconform/dpconform/topologies/netns"
)

const usage = `dpconform: conformance of Kubernetes dataplanes across transitions

usage:
  dpconform run --driver PATH [--profiles Core,...] [--focus ID] [--output DIR]
                [--repeat N] [--quiet] [-v] [--topology netns|kind|cluster]
                [--kubeconfig K ...]
                                       run the suite against an implementation's driver
                                       (each spec N times: it passes only if all N pass;
                                       the report gives each figure's spread); cluster:
                                       an existing cluster (docs/certification.md)
  dpconform fuzz --driver PATH [--seed S] [--duration T | --rounds N] [--steps N]
                 [--replay FILE] [--output DIR]
                                       compose transitions at random, judge them from a
                                       model of the Services, and shrink a failing
                                       schedule to a replay file (docs/fuzzing.md)
  dpconform report DIR                 make report.yaml and report.html again from the
                                       run data saved in DIR
  dpconform specs [--markdown]         list the spec catalogue (--markdown: docs/specs.md)
  dpconform matrix [--beside DIR ...] LEDGER
                                       the transition matrix of the results ledger
                                       (docs/results), with runs of one's own beside it;
                                       --write: the ledger's page and README's blocks
  dpconform publish --run NAME --command CMD OUTPUT_DIR LEDGER
                                       put a run's report into the results ledger with
                                       its provenance (the repository's commit)
  dpconform cleanup [--run ID ...] [--images]
                                       remove what killed runs left behind, netns and
                                       kind (idempotent); --images: the kind images too
  dpconform cleanup --kubeconfig K [--run ID ...]
                                       remove what killed cluster runs left on that
                                       cluster (by their run label; spares live runs)
  dpconform topology up [flags]        bring a netns topology up and hold it until ^C
  dpconform probe ROLE [flags]         a traffic probe (the suite runs it in namespaces)
  dpconform pause                      wait for SIGTERM (the kind topology's pods and
                                       external client run it; probes join them)
  dpconform node-op OP ARGS...         a node's network operation, in the cluster
                                       topology's helper pods (topologies/cluster)
`

func main() {
	dockerd.RuntimeWrapperMain()
	cluster.RunExecHelperIfChild()
	probe.RunIfChild()
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "fuzz":
		err = fuzzCmd(os.Args[2:])
	case "report":
		err = rebuildReport(os.Args[2:])
	case "specs":
		err = specs(os.Args[2:])
	case "matrix":
		err = matrix(os.Args[2:])
	case "publish":
		err = publish(os.Args[2:])
	case "probe":
		os.Exit(probe.Main(os.Args[2:]))
	case "pause":
		pause()
	case "node-op":
		err = cluster.NodeOp(os.Args[2:], os.Stdout)
	case "cleanup":
		err = cleanup(os.Args[2:])
	case "topology":
		if len(os.Args) < 3 || os.Args[2] != "up" {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		err = topologyUp(os.Args[3:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "dpconform: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dpconform:", err)
		os.Exit(1)
	}
}

// pause holds a container of the kind or cluster topology until it is stopped: a
// pod's workload container or the external client, whose namespaces the suite's
// probes enter (kind) or run in (cluster, through pods/exec). Stopped, it waits for
// the pod's servers to end first, as a server drains before it exits: the container's
// end would end the pod, and with it (cluster) the probes or (kind) the pod's network,
// in the middle of a graceful deletion that a spec watches them serve through. On a
// cluster the probes are the other processes of its PID namespace; on kind they are
// not in it, but their sockets are in its network namespace. The kubelet's SIGKILL
// at the end of the grace period still ends it.
//
// On kind it once exited at once: SVC-ENDPOINT-CHURN then lost the race between the
// kubelet tearing the terminating pod's network down (~170-250 ms after its deletion
// began) and the dataplane learning from its EndpointSlice that it was no longer
// ready (~370 ms): 12 of 2,379 new connections timed out (make test, 2026-12-03).
func pause() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	// Only as its PID namespace's init: a helper pod in the host's PID namespace
	// (hostPID, and hostNetwork with it) has the whole node's processes and sockets
	// beside it.
	for os.Getpid() == 1 && (othersRun() || serving("/proc/self/net")) {
		time.Sleep(50 * time.Millisecond)
	}
}

// serving reports whether a TCP socket listens, or a UDP socket is open, in the
// network namespace whose socket tables are in dir (/proc/self/net: this process's):
// a server of the pod's.
func serving(dir string) bool {
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for i, line := range strings.Split(string(data), "\n") {
			// sl local_address rem_address st ...: st 0A is TCP_LISTEN.
			fields := strings.Fields(line)
			if i == 0 || len(fields) < 4 {
				continue
			}
			if strings.HasPrefix(f, "udp") || fields[3] == "0A" {
				return true
			}
		}
	}
	return false
}

// othersRun reports whether a process other than this one runs in its PID namespace.
func othersRun() bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if proc.Alive(pid) {
			return true
		}
	}
	return false
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func cleanup(args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ExitOnError)
	var runs multiFlag
	fs.Var(&runs, "run", "a run ID to remove even if its owner is alive (repeatable); default: every run whose owner is gone")
	images := fs.Bool("images", false, "also remove the images the kind topology built (node image and the rest): the next kind run rebuilds them")
	kubeconfig := fs.String("kubeconfig", "", "remove killed cluster runs' objects from this cluster instead (namespaces and cluster-scoped objects labelled "+cluster.RunLabel+")")
	fs.Parse(args)
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	if *kubeconfig != "" {
		return cluster.Cleanup(context.Background(), cluster.CleanupOptions{Kubeconfig: *kubeconfig, Runs: runs, Logf: logf})
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("cleanup removes network namespaces, links and mounts: run it as root")
	}
	removed, err := netns.Cleanup(netns.CleanupOptions{RunIDs: runs, Logf: logf})
	if len(removed) == 0 && err == nil {
		fmt.Println("netns: nothing to clean up")
	}
	// kind: killed runs' clusters, containers and networks (the project's dockerd
	// is started for it only if it has ever run here).
	return errors.Join(err, kind.Cleanup(context.Background(), kind.CleanupOptions{Images: *images, Logf: logf}))
}

func topologyUp(args []string) error {
	fs := flag.NewFlagSet("topology up", flag.ExitOnError)
	nodes := fs.Int("nodes", 2, "number of nodes")
	pods := fs.Int("pods", 0, "pods to add, spread over the nodes")
	fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	topo, err := netns.New(ctx, netns.Options{Nodes: *nodes, Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer topo.Close()
	for i := 0; i < *pods; i++ {
		n := topo.Nodes()[i%len(topo.Nodes())]
		p, err := topo.AddPod(ctx, topologies.PodSpec{Name: fmt.Sprintf("pod-%d", i), Node: n.Name()})
		if err != nil {
			return err
		}
		fmt.Printf("pod %s on %s: %s\n", p.Name(), n.Name(), p.IP())
	}
	for _, n := range topo.Nodes() {
		fmt.Printf("node %s: %s, pods %s, netns %s\n", n.Name(), n.IP(), n.PodCIDR(), strings.TrimPrefix(n.DriverEnv()[1], "DPC_NETNS="))
	}
	fmt.Printf("kubeconfig: %s\nholding the topology until ^C\n", topo.Kubeconfig())
	<-ctx.Done()
	return topo.Close()
}
