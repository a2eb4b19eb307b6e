package peers

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/internal/ledger"
)

// The peers tier. make test runs the kube-proxy peers in full every time; the peers
// whose full runs take too long for every CI (Cilium's Core, kube-router's Policy) run
// in `make test-peers`, which writes each run into the results ledger (docs/results)
// with the commit it ran at. make test then guards them: TestPeerTierResultsCurrent
// fails when anything such a run was judged by changed after it, so a change to the
// specs, the instrument, the topology or a peer's driver lands only with that peer
// run again.

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// ledgerRoot is the results ledger, from the repository's root.
const ledgerRoot = "docs/results"

// envLedger, set to 1 (make test-peers does), makes a full run of a tier peer write
// itself into the ledger.
const envLedger = "DPC_LEDGER"

// tierRun is a run of a peer that make test-peers writes into the ledger and make
// test guards.
type tierRun struct {
	// Peer is the peer's name: its Ginkgo label, driver (conformance/cmd/<peer>-driver)
	// and, in the ledger, its implementation's name.
	Peer string
	// Run names the run in the ledger (<peer>/<version>/<run>), Profile the profile it
	// runs; TestFile holds its Describe and the peer's documented behaviours.
	Run, TestFile string
	Profile       conformance.Profile
}

// tierRuns are the runs written to the ledger. Cilium's and kube-router's run only in
// make test-peers; kube-proxy's run in make test too, and are written by make
// test-peers PEERS=kube-proxy.
var tierRuns = []tierRun{
	{Peer: "cilium", Run: "core", TestFile: "cilium_test.go", Profile: conformance.Core},
	{Peer: "kube-router", Run: "policy", TestFile: "kuberouter_test.go", Profile: conformance.Policy},
	{Peer: "kube-proxy", Run: "iptables-core", TestFile: "kubeproxy_test.go", Profile: conformance.Core},
	{Peer: "kube-proxy", Run: "nftables-core", TestFile: "kubeproxy_test.go", Profile: conformance.Core},
	{Peer: "kube-proxy", Run: "iptables-to-nftables-modeswitch", TestFile: "kubeproxy_test.go", Profile: conformance.ModeSwitch},
}

// judgedBy are the paths (git pathspecs, from the repository's root) whose content
// decides a tier run's results: the suite's engine and specs, the instrument and the
// driver contract (fv), the topology's code and control plane, the shared internals,
// the module's dependencies, and the peer's own driver, build, documented behaviours
// and this package's runner. Tests of those packages and the docs do not. Git lets an
// exclude win over any include, so no exclude names a folder an include is in
// (TestJudgedByCoversWhatDecidesARun).
func (p tierRun) judgedBy() []string {
	return []string{
		":(glob)conformance/*", "conformance/specs", "conformance/report", "conformance/record/record.go", "fv", ":(glob)topologies/*",
		"topologies/netns", "topologies/controlplane", "topologies/kubeobj", "internal",
		"go.mod", "go.sum",
		":(exclude,glob)conformance/*_test.go", ":(exclude,glob)conformance/specs/*_test.go", ":(exclude,glob)conformance/report/*_test.go",
		":(exclude,glob)fv/**/*_test.go", ":(exclude,glob)topologies/**/*_test.go",
		":(exclude,glob)internal/**/*_test.go", ":(exclude,glob)**/testdata/**",
		":(exclude)internal/ledger", ":(exclude)internal/layering", ":(exclude)internal/testtime",
		// The kit and the libraries of drivers/ that the suite or the driver runs.
		"driver", "drivers/internal", "drivers/kubeproxy", ":(exclude,glob)driver/**/*_test.go",
		":(exclude,glob)drivers/internal/**/*_test.go", ":(exclude,glob)drivers/kubeproxy/*_test.go",
		"drivers/" + p.Peer + "-driver", ":(exclude,glob)drivers/" + p.Peer + "-driver/*_test.go",
		"topologies/binaries/go.mod", "topologies/binaries/go.sum", "topologies/binaries/build.sh",
		"topologies/binaries/" + p.Peer,
		"conformance/peers/run_test.go", "conformance/peers/" + p.TestFile,
	}
}

// publication gathers a tier peer's results, to write into the ledger once its whole
// profile ran.
type publication struct {
	peer    tierRun
	runner  *conformance.Runner
	results []conformance.Result
}

func newPublication(peer, run string) *publication {
	i := slices.IndexFunc(tierRuns, func(p tierRun) bool { return p.Peer == peer && p.Run == run })
	if i < 0 {
		panic(peer + " " + run + " is no run of the peers tier (tierRuns)")
	}
	return &publication{peer: tierRuns[i]}
}

// add records one spec's result and the runner that ran it.
func (p *publication) add(res conformance.Result, r *conformance.Runner) {
	p.runner = r
	p.results = append(p.results, res)
}

// write puts the run into the ledger when DPC_LEDGER=1 and every spec of the profile
// ran; otherwise it says why not.
func (p *publication) write() {
	GinkgoHelper()
	if os.Getenv(envLedger) != "1" {
		return
	}
	var want []string
	for _, s := range conformance.Specs() {
		if s.Profile == p.peer.Profile {
			want = append(want, s.ID)
		}
	}
	if len(p.results) != len(want) || p.runner == nil {
		AddReportEntry("ledger", fmt.Sprintf("%s not written to the ledger: %d of its %d %s specs ran", p.peer.Peer, len(p.results), len(want), p.peer.Profile))
		return
	}
	out := filepath.Join(repoRoot, "_output", "peers", p.peer.Peer, p.peer.Run)
	Expect(os.MkdirAll(out, 0o755)).To(Succeed())
	rec := record.NewRunRecord(p.runner, "netns", p.results, time.Now())
	report := filepath.Join(out, ledger.ReportFile)
	Expect(rec.Report().WriteYAML(report)).To(Succeed())
	head, err := ledger.Head(repoRoot)
	Expect(err).NotTo(HaveOccurred())
	dir := filepath.Join(repoRoot, ledgerRoot, p.peer.Peer, rec.Implementation.Version, p.peer.Run)
	prov := ledger.Provenance{
		Commit: head, Topology: "netns", Command: "make test-peers PEERS=" + p.peer.Peer,
		Date: rec.Date, Machine: ledger.Machine(),
	}
	Expect(ledger.Write(repoRoot, dir, report, prov, p.peer.judgedBy())).To(Succeed())
	AddReportEntry("ledger", "wrote "+strings.TrimPrefix(dir, repoRoot+"/"))
	GinkgoWriter.Printf("ledger: wrote %s\n", dir)
}
