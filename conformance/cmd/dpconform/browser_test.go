package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/conformance/record"
	"github.com/dpconform/dpconform/internal/buildbin"
	"github.com/dpconform/dpconform/internal/privileged"
)

// browserOutput is where the test leaves its run and its screenshots for a person to
// look at: _output/report-browser under the repository.
var browserOutput = filepath.Join("..", "..", "..", "_output", "report-browser")

// TestReportOfAFailedRunInABrowser runs a spec against refdp with a fault it catches
// (RESTART-NODEPORT-NEW, eager-service-sync) through the dpconform command, as a
// vendor runs it, and loads the report.html of that failed run in Debian's chromium:
// it must load without a console error or a fetch off the page, its chart of the
// failure must hold as many failure marks as the checks counted failed attempts and
// a line per transition event, and a screenshot of it lands in browserOutput.
func TestReportOfAFailedRunInABrowser(t *testing.T) {
	privileged.Require(t)
	chromium := findChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bins, err := buildbin.Build(ctx, t.TempDir(), "conformance/cmd/dpconform", "reference/cmd/refdp", "drivers/refdp-driver")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(browserOutput); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(browserOutput, "run")

	// The failed run, with progress as a CI log shows it (stderr is not a terminal).
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bins["dpconform"], "run", "--driver", bins["refdp-driver"],
		"--driver-env", "DPC_REFDP_FAULTS=eager-service-sync", "--focus", "^RESTART-NODEPORT-NEW$", "--output", runDir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("dpconform run:\nstderr:\n%s\nstdout:\n%s", stderr.String(), stdout.String())
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("dpconform run against the fault: %v, want exit status 1 (not certified)", err)
	}
	progress := stderr.String()
	for _, want := range []string{"[1/1] RESTART-NODEPORT-NEW · topology · ", "· steady state · ", "· transition · ", "· settle · ", "· checks · ",
		"[1/1] RESTART-NODEPORT-NEW ✗ FAILED (reset) in "} {
		if !strings.Contains(progress, want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if strings.Contains(progress, "\x1b[") {
		t.Error("progress to a pipe has colour codes")
	}

	rec, err := record.LoadRun(runDir)
	if err != nil {
		t.Fatal(err)
	}
	var res conformance.Result
	for _, r := range rec.Results {
		if r.ID == "RESTART-NODEPORT-NEW" {
			res = r
		}
	}
	if res.Result != conformance.Failed || !slices.Contains(res.FailedKinds(), "reset") {
		t.Fatalf("RESTART-NODEPORT-NEW with eager-service-sync: %s %v %s, want failed with resets", res.Result, res.FailedKinds(), res.Reason)
	}
	var failedAttempts float64
	failedChecks := 0
	for _, c := range res.Checks {
		if c.Passed {
			continue
		}
		failedChecks++
		for _, f := range c.Figures {
			if f.Name == "failed_attempts" {
				failedAttempts += f.Value
			}
		}
	}
	tl, err := conformance.ReadTimeline(filepath.Join(runDir, res.Timeline))
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, tr := range tl.Transitions {
		if tr.Time >= tl.Scenarios[0].From && tr.Time <= tl.Scenarios[0].End {
			events = append(events, tr.Name)
		}
	}
	if !slices.Equal(events, []string{"stop-sent", "exited", "start-sent", "ready"}) {
		t.Fatalf("the scenario's transition events: %v, want a graceful restart's", events)
	}

	// `dpconform report DIR` makes the same page and report.yaml from the saved data.
	rebuilt := filepath.Join(browserOutput, "rebuilt")
	if err := os.CopyFS(rebuilt, os.DirFS(runDir)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{record.HTMLFile, record.YAMLFile} {
		if err := os.Remove(filepath.Join(rebuilt, f)); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.CommandContext(ctx, bins["dpconform"], "report", rebuilt).CombinedOutput(); err != nil {
		t.Fatalf("dpconform report: %v\n%s", err, out)
	}
	for _, f := range []string{record.HTMLFile, record.YAMLFile} {
		a, _ := os.ReadFile(filepath.Join(runDir, f))
		b, _ := os.ReadFile(filepath.Join(rebuilt, f))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s rebuilt from the saved run differs from the run's (%d and %d bytes)", f, len(a), len(b))
		}
	}

	page, err := filepath.Abs(filepath.Join(runDir, record.HTMLFile))
	if err != nil {
		t.Fatal(err)
	}
	got, problems, shots := loadInChromium(ctx, t, chromium, "file://"+page)
	for _, p := range problems {
		t.Errorf("the page in chromium: %s", p)
	}
	t.Logf("in chromium: %+v", got)
	if got.Failed != failedAttempts || failedAttempts == 0 {
		t.Errorf("the chart's failure marks count %v attempts, the checks %v", got.Failed, failedAttempts)
	}
	if !slices.Equal(got.Events, events) {
		t.Errorf("the chart's event lines %v, want %v", got.Events, events)
	}
	if got.Firsts != failedChecks {
		t.Errorf("%d first-violation markers, want %d (one per failed check)", got.Firsts, failedChecks)
	}
	if got.Outside != 0 || got.Width < 900 || got.Height < 100 {
		t.Errorf("the chart is %vx%v px with %d failure marks off it or empty: not laid out", got.Width, got.Height, got.Outside)
	}
	if got.FailFill != "rgb(214, 39, 40)" {
		t.Errorf("a reset mark is filled %q, want the page's red: its style did not apply", got.FailFill)
	}
	if !got.Open {
		t.Error("the failed spec's section is closed: a reader should see its chart at once")
	}
	for name, png := range shots {
		path := filepath.Join(browserOutput, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
	}
}

// chartFacts is what the test reads from the loaded page.
type chartFacts struct {
	Failed   float64  `json:"failed"`
	Breaches float64  `json:"breaches"`
	Events   []string `json:"events"`
	Firsts   int      `json:"firsts"`
	Width    float64  `json:"width"`
	Height   float64  `json:"height"`
	Outside  int      `json:"outside"`
	FailFill string   `json:"failFill"`
	Open     bool     `json:"open"`
}

const readChart = `(() => {
  const svg = document.querySelector('svg#RESTART-NODEPORT-NEW-s1[data-chart=overview]');
  if (!svg) return null;
  const sum = sel => [...svg.querySelectorAll(sel)].reduce((a, r) => a + Number(r.dataset.n), 0);
  const box = svg.getBoundingClientRect();
  const fails = [...svg.querySelectorAll('.fail.attempt')];
  return {
    failed: sum('.fail.attempt'),
    breaches: sum('.breach'),
    events: [...svg.querySelectorAll('g.event')].map(g => g.dataset.event),
    firsts: svg.querySelectorAll('g.first').length,
    width: box.width, height: box.height,
    outside: fails.filter(r => { const b = r.getBoundingClientRect();
      return b.width <= 0 || b.left < box.left - 1 || b.right > box.right + 1 || b.top < box.top || b.bottom > box.bottom; }).length,
    failFill: fails.length ? getComputedStyle(fails[0]).fill : '',
    open: document.querySelector('section#RESTART-NODEPORT-NEW > details').open,
  };
})()`

// loadInChromium loads url in a headless chromium that may not touch the network, and
// returns what readChart finds, every console error, exception and request off the
// page, and screenshots of the page and of the failed spec.
func loadInChromium(ctx context.Context, t *testing.T, chromium, url string) (chartFacts, []string, map[string][]byte) {
	t.Helper()
	// As root, with no sandbox and a fresh profile; no GPU, QUIC, first-run,
	// component updates, sync or background networking: otherwise chromium reaches
	// for the network on its own.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()

	// The listener sees every event of the tab from its start, in order.
	var (
		mu       sync.Mutex
		problems []string
	)
	record := func(s string) {
		mu.Lock()
		problems = append(problems, s)
		mu.Unlock()
	}
	listen := func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				record("console " + string(ev.Type) + ": " + strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			record("exception: " + ev.ExceptionDetails.Text)
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
				record("log " + string(ev.Entry.Level) + ": " + ev.Entry.Text + " " + ev.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			if !strings.HasPrefix(ev.Request.URL, "file://") {
				record("request off the page: " + ev.Request.URL)
			}
		}
	}
	bctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf), chromedp.WithListener(listen))
	defer cancel()
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("chromium: %s: %v", what, err)
		}
	}
	fail("start", chromedp.Do(bctx))
	_, err := chromedp.Call(bctx, cdplog.Enable, cdp.Empty{})
	fail("enable the log", err)
	_, err = chromedp.Call(bctx, network.Enable, network.EnableParams{})
	fail("enable network events", err)
	fail("load "+url, chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`svg#RESTART-NODEPORT-NEW-s1`))))
	facts, err := chromedp.Run(bctx, chromedp.Evaluate[*chartFacts](readChart))
	fail("read the chart", err)
	if facts == nil {
		t.Fatal("the page has no overview chart of RESTART-NODEPORT-NEW")
	}
	page, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	fail("screenshot the page", err)
	spec, err := chromedp.Run(bctx, chromedp.Screenshot(chromedp.CSS(`section#RESTART-NODEPORT-NEW`)))
	fail("screenshot the failed spec", err)
	// Messages the page logged late arrive before the browser is closed.
	fail("settle", chromedp.Do(bctx, chromedp.Sleep(200*time.Millisecond)))
	mu.Lock()
	defer mu.Unlock()
	return *facts, append([]string(nil), problems...), map[string][]byte{"report.png": page, "failed-spec.png": spec}
}

// findChromium returns Debian's chromium, installing it when it is missing (make
// deps-browser does the same).
func findChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	t.Log("chromium is missing: apt-get install chromium")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "chromium"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get %s: %v\n%s\n(make deps-browser installs it)", strings.Join(args, " "), err, out)
		}
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is still missing after apt-get install chromium (make deps-browser)")
	}
	return p
}
