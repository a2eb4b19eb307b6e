package peers

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/dpconform/dpconform/internal/ledger"
)

// TestPeerTierResultsCurrent holds each run of the peers tier to the code: its newest
// entry in the ledger must exist, and nothing it was judged by may have changed since
// the commit it ran at. It needs git and the repository's history, neither root nor a
// binary, so make check runs it too.
func TestPeerTierResultsCurrent(t *testing.T) {
	runs, err := ledger.Load(filepath.Join(repoRoot, ledgerRoot))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tierRuns {
		t.Run(p.Peer+"/"+p.Run, func(t *testing.T) {
			var newest *ledger.Run
			for i, r := range runs {
				if r.Implementation == p.Peer && r.Name == p.Run && (newest == nil || r.Provenance.Date.After(newest.Provenance.Date)) {
					newest = &runs[i]
				}
			}
			if newest == nil {
				t.Fatalf("no %s run of %s in %s: run `make test-peers PEERS=%s` and commit the entry it writes", p.Run, p.Peer, ledgerRoot, p.Peer)
			}
			why, err := ledger.Stale(repoRoot, *newest, p.judgedBy())
			if err != nil {
				t.Fatal(err)
			}
			if why != "" {
				t.Error(why)
			}
		})
	}
}

// What a tier run is judged by takes in the code that decides its verdicts, the peer's
// driver and its documented behaviours among them, and leaves out the docs, other
// tests and what only publishes: a pathspec that excluded a folder an include is in
// would drop the include without a word.
func TestJudgedByCoversWhatDecidesARun(t *testing.T) {
	for _, p := range tierRuns {
		t.Run(p.Peer+"/"+p.Run, func(t *testing.T) {
			files, err := ledger.Files(repoRoot, p.judgedBy())
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"conformance/runner.go", "conformance/specs/restart_nodeport_new.go", "fv/probe/config.go",
				"fv/matchers/streams.go", "topologies/netns/cleanup.go", "topologies/controlplane/reset.go", "conformance/report/report.go",
				"drivers/" + p.Peer + "-driver/main.go", "driver/daemon/daemon.go", "driver/skel/skel.go",
				"drivers/kubeproxy/kubeproxy.go", "drivers/internal/cache/cache.go", "conformance/peers/run_test.go",
				"conformance/peers/" + p.TestFile, "topologies/binaries/go.mod", "go.mod",
			} {
				if !slices.Contains(files, want) {
					t.Errorf("%s is not among what the run is judged by", want)
				}
			}
			for _, not := range []string{
				"docs/README.md", "conformance/selftest/selftest_test.go", "conformance/cmd/dpconform/main.go",
				"conformance/specs/catalogue_test.go", "conformance/peers/tier_test.go", "internal/ledger/ledger.go",
				"conformance/results/matrix.go", "topologies/kind/kind.go", "fv/probe/bench_test.go",
				"driver/daemon/daemon_test.go", "drivers/refdp-driver/main.go",
			} {
				if slices.Contains(files, not) {
					t.Errorf("%s is among what the run is judged by; it decides no verdict", not)
				}
			}
		})
	}
}
