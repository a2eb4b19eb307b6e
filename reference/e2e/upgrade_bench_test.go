package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/dpconform/dpconform/bpf"
	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/fv/harness"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/workloads"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/reference/agent"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// Sizes of the upgrade benchmark: a million entries in a table twice that size.
const (
	benchEntries = 1_000_000
	benchCTSize  = "2097152"
)

// BenchmarkConntrackUpgrade upgrades node-a's refdp from v1 to v2, its conntrack
// table holding 1,000,000 entries, while streams and new connections run through
// the node, and reports what the targets are about (under 2 s, under
// 200 MB): the migration's copy time and entries, from the agent's status file,
// the time from the start of v2 to ready, and the agent's peak RSS (VmHWM, all of
// its life: adoption, migration, informers, first round). The traffic must come
// through: a reset or a dead stream fails the benchmark; its figures are printed.
func BenchmarkConntrackUpgrade(b *testing.B) {
	privileged.Require(b)
	dir := b.TempDir()
	if _, err := buildbin.Build(context.Background(), dir, "reference/cmd/refdp", "drivers/refdp-driver"); err != nil {
		b.Fatal(err)
	}
	drv, err := driver.NewExec(filepath.Join(dir, "refdp-driver"), driver.DefaultTimeouts)
	if err != nil {
		b.Fatal(err)
	}
	var copyMs, readyMs, rssMB float64
	for i := 0; i < b.N; i++ {
		c, r, m := upgradeOnce(b, drv)
		copyMs, readyMs, rssMB = copyMs+c, readyMs+r, rssMB+m
	}
	n := float64(b.N)
	b.ReportMetric(copyMs/n, "ms-copy-1M")
	b.ReportMetric(readyMs/n, "ms-start-to-ready")
	b.ReportMetric(rssMB/n, "MB-agent-peak-RSS")
	b.ReportMetric(0, "ns/op")
}

func upgradeOnce(b *testing.B, drv driver.Driver) (copyMs, readyMs, rssMB float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	info, err := drv.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	topo, err := netns.New(ctx, netns.Options{CNIConfig: info.CNI, CNIDirs: info.CNIDirs()})
	if err != nil {
		b.Fatal(err)
	}
	defer topo.Close()
	prog, err := probe.Self()
	if err != nil {
		b.Fatal(err)
	}
	w := harness.New(topo, drv, prog)
	defer w.Cleanup(context.Background())
	w.StartOptions = driver.StartOptions{Version: "v1", Set: map[string]string{"ct-size": benchCTSize}}
	if err := w.StartAll(ctx); err != nil {
		b.Fatal(err)
	}
	f, err := workloads.DeployCore(ctx, w, workloads.DefaultWarm)
	if err != nil {
		b.Fatal(err)
	}
	// The suite's own engine runs the traffic, the upgrade and the checks, as a spec
	// would (UPGRADE-VERSION judges this transition; here it is measured).
	e := &conformance.Env{World: w, Topo: topo, Info: info, Budgets: conformance.DefaultBudgets,
		Logf: func(format string, args ...any) { b.Logf(format, args...) }}
	sc := conformance.Scenario{Settle: 3 * time.Second}
	for _, fl := range append(f.DirectFlows(), f.ServiceFlows(topo)...) {
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Stream("stream-"+fl.Name, fl.Target, 2)})
	}
	for _, fl := range f.ServiceFlows(topo) {
		sc.Traffic = append(sc.Traffic, conformance.Traffic{From: fl.From, Probe: e.Connect("connect-"+fl.Name, fl.Target)})
	}
	var st *agent.Status
	sc.Transition = []conformance.Step{
		conformance.Stop(f.NodeA),
		// What a busy node's table holds, written while no agent runs: the datapath
		// keeps forwarding meanwhile, on v1's programs.
		conformance.Do("fill v1's conntrack table", func(context.Context, *conformance.Env) error {
			fill(b, filepath.Join(nodeEnv(f.NodeA, "DPC_BPFFS"), "refdp", bpf.ConntrackFormatV1.PinName()), benchEntries)
			return nil
		}),
		conformance.Do("start v2 and wait until it is ready", func(ctx context.Context, e *conformance.Env) error {
			started := time.Now()
			if err := e.World.StartWith(ctx, f.NodeA, driver.StartOptions{Version: "v2", Set: map[string]string{"ct-size": benchCTSize}}); err != nil {
				return err
			}
			if err := e.World.WaitReady(ctx, f.NodeA); err != nil {
				return err
			}
			readyMs = float64(time.Since(started).Microseconds()) / 1000
			s, err := agent.ReadStatus(nodeEnv(f.NodeA, "DPC_STATE_DIR"))
			st = &s
			return err
		}),
	}
	sc.Checks = []conformance.Check{
		{Name: "no reset", Matcher: matchers.HaveNoResets()},
		{Name: "every stream alive at the end", Matcher: matchers.BeAliveAtEnd()},
		{Name: "no stream gap over 200 ms", Matcher: matchers.HaveStreamGapsWithin(200 * time.Millisecond)},
		{Name: "no failed new connection", Matcher: matchers.HaveNoFailedAttempts()},
	}
	if err := e.Run(ctx, sc); err != nil {
		b.Fatal(err)
	}
	rssMB = peakRSS(b, st.PID)
	if st.Migration == nil || st.Migration.Copied+st.Migration.Present < benchEntries {
		b.Fatalf("the agent migrated %+v, want %d entries", st.Migration, benchEntries)
	}
	for _, c := range e.Checks() {
		if !c.Passed {
			b.Errorf("traffic through the upgrade: %s\n%s", c.Name, c.Message)
		}
		for _, f := range c.Figures {
			b.Logf("%s: %s", c.Name, f.Text)
		}
	}
	b.Logf("migrated %v: %d entries copied, %d present, copy %.1f ms; start to ready %.0f ms; agent peak RSS %.1f MB",
		st.Migration.From, st.Migration.Copied, st.Migration.Present, st.Migration.DurationMs, readyMs, rssMB)
	return st.Migration.DurationMs, readyMs, rssMB
}

// fill writes n conntrack entries of format 1 into the pinned map at pin: the two
// entries each of n/2 flows of 10.x.y.z clients to a ClusterIP, none of them the
// traffic's.
func fill(b *testing.B, pin string, n int) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	v, err := bpf.ConntrackValue{Flags: bpf.ConntrackDNAT, ServiceID: 1, NATAddr: netip.MustParseAddr("10.244.1.200"), NATPort: 8080}.MarshalFormat(bpf.ConntrackFormatV1)
	if err != nil {
		b.Fatal(err)
	}
	const chunk = 8192
	keys := make([][16]byte, chunk)
	vals := make([][32]byte, chunk)
	for i := range vals {
		copy(vals[i][:], v)
	}
	for done := 0; done < n; {
		c := min(chunk, n-done)
		for i := 0; i < c; i++ {
			id := uint32(done + i)
			k := &keys[i]
			k[0], k[1], k[2], k[3] = 10, 100+byte(id>>16), byte(id>>8), byte(id)
			k[4], k[5], k[6], k[7] = 10, 96, 200, 1
			binary.BigEndian.PutUint16(k[8:], 40000)
			binary.BigEndian.PutUint16(k[10:], 80)
			k[12] = 6
		}
		if _, err := m.BatchUpdate(keys[:c], vals[:c], nil); err != nil {
			b.Fatalf("fill %s: %v", pin, err)
		}
		done += c
	}
}

// peakRSS is the peak resident set of process pid (VmHWM), in MB.
func peakRSS(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				b.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// nodeEnv is the value of key in n's driver environment.
func nodeEnv(n topologies.Node, key string) string {
	for _, kv := range n.DriverEnv() {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
