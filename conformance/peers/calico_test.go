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
	"sigs.k8s.io/yaml"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/driver/drivertest"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/internal/privileged"
)

// envCalicoDirs gives the Calico builds to judge: directories that `make calico`
// made, separated by colons (~/.cache/dpconform/calico/v3.31.5:~/.cache/...). Calico's
// releases are not on the module proxy, so neither CI nor `make test` can build them:
// without it the Calico specs skip, loudly (privileged.SkipOptionalPeer).
const envCalicoDirs = "DPC_CALICO_DIR"

// calicoSpecs are the specs of the seeds Calico's own history gave the suite, run
// against every build given: seed 1 (Calico issue 12192, fixed between v3.31.5 and
// v3.31.6 by merge ee0a65248dcf): Felix's service sync after a restart ran before it
// knew the node's addresses and erased its NodePort frontends for a moment, so new
// NodePort connections were reset.
var calicoSpecs = []string{"RESTART-NODEPORT-NEW", "RESTART-NODEPORT-CRASH"}

// calicoExpected is what the suite must conclude about each Calico version on
// calicoSpecs: a spec a version is listed for must fail, with exactly those kinds,
// and every other spec must pass (docs/calico.md, with the evidence). A version
// missing here is an error: declare what it should do before judging it.
var calicoExpected = map[string]map[string][]conformance.FailureKind{
	// The last release with the bug: every NodePort connection opened in the window
	// is reset.
	"v3.31.5": {
		"RESTART-NODEPORT-NEW":   {matchers.KindReset},
		"RESTART-NODEPORT-CRASH": {matchers.KindReset},
	},
	// The first release with the fix: passes both.
	"v3.31.6": {},
}

// calicoBuild is a `make calico` directory: its version and commit (BUILDINFO).
type calicoBuild struct {
	Dir     string `json:"-"`
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Err     error  `json:"-"`
}

// calicoBuilds are the builds envCalicoDirs names, read when the spec tree is built
// so that each spec is named by its build's version; an unreadable one carries why.
func calicoBuilds() []calicoBuild {
	var out []calicoBuild
	for _, dir := range strings.Split(os.Getenv(envCalicoDirs), ":") {
		if dir == "" {
			continue
		}
		b := calicoBuild{Dir: dir, Version: dir}
		data, err := os.ReadFile(filepath.Join(dir, "BUILDINFO"))
		if err == nil {
			err = yaml.Unmarshal(data, &b)
		}
		if err != nil {
			b.Err = fmt.Errorf("%s=%s: not a `make calico` build: %w", envCalicoDirs, dir, err)
		}
		out = append(out, b)
	}
	return out
}

// Seed 1 against the Calico builds given in DPC_CALICO_DIR, through
// conformance/cmd/calico-driver: each must do what calicoExpected says.
var _ = Describe("Calico", Ordered, func() {
	builds := calicoBuilds()
	if len(builds) == 0 {
		It("is judged when "+envCalicoDirs+" names builds", func() {
			privileged.SkipOptionalPeer(Skip, "Calico (Felix, eBPF dataplane)", envCalicoDirs,
				"build Calico from a source tree with `make calico CALICO_SRC=/path/to/calico` (docs/calico.md) and set it to the directories it prints, separated by colons")
		})
		return
	}

	var calicoDriver string
	BeforeAll(func(ctx SpecContext) {
		calicoDriver = drivertest.Build(ctx, "conformance/cmd/calico-driver")
	}, NodeTimeout(5*time.Minute))

	for _, b := range builds {
		for _, id := range calicoSpecs {
			It(b.Version+" on "+id+" does what calicoExpected says", func(ctx SpecContext) {
				Expect(b.Err).NotTo(HaveOccurred())
				expected, ok := calicoExpected[b.Version]
				Expect(ok).To(BeTrue(), "no expectation declared for Calico %s (%s): add it to calicoExpected, with its evidence in docs/calico.md", b.Version, b.Dir)
				i := slices.IndexFunc(conformance.Specs(), func(s conformance.Spec) bool { return s.ID == id })
				Expect(i).NotTo(Equal(-1), "no spec %s", id)
				s := conformance.Specs()[i]

				d := drivertest.NewExec(calicoDriver, envCalicoDirs+"="+b.Dir)
				res := runPeer(ctx, d, "calico-"+b.Version, s, conformance.Budgets{}, "calico", b.Version, id)
				AddReportEntry("Calico "+b.Version+" ("+b.Commit+")", string(res.Result)+" "+res.Reason)
				if kinds, ok := expected[id]; ok {
					Expect(res.Result).To(Equal(conformance.Failed), "Calico %s must fail %s with %v (docs/calico.md): the suite no longer catches its bug\n%s", b.Version, id, kinds, res.Message)
					for _, k := range res.FailedKinds() {
						Expect(kinds).To(ContainElement(k), "%s failed against Calico %s in a way docs/calico.md does not document: %s\n%s", id, b.Version, res.Reason, res.Message)
					}
					return
				}
				expectPassed(res)
			}, SpecTimeout(6*time.Minute))
		}
	}
})
