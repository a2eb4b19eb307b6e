package fuzz

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/dpconform/dpconform/conformance"
)

// Options configure a fuzz run.
type Options struct {
	// Seed draws every round's schedule (Generate): a run is repeated by its seed.
	Seed uint64
	// Steps is how many steps a round's schedule has, drawn over Span.
	Steps int
	Span  time.Duration
	// ConnectInterval is the time between new connections on each path (0:
	// DefaultConnectInterval).
	ConnectInterval time.Duration
	// Mode is the implementation's mode the agents start in (empty: its default).
	Mode string
	// Rounds bounds the run to that many rounds; Duration, to the rounds that start
	// within it. The run stops at the first round that finds a violation.
	Rounds   int
	Duration time.Duration
	// Shrink reduces a failing schedule to a minimal one that still fails, replaying
	// each candidate up to Replays times (a candidate fails if any replay does).
	Shrink  bool
	Replays int
	// Logf reports progress; may be nil.
	Logf func(format string, args ...any)
}

// Defaults of Options.
const (
	DefaultSteps   = 8
	DefaultSpan    = 15 * time.Second
	DefaultReplays = 2
)

// Round is one round of a run, as the run's record keeps it.
type Round struct {
	Round    int                    `json:"round"`
	Steps    int                    `json:"steps"`
	Result   conformance.ResultKind `json:"result"`
	Reason   string                 `json:"reason,omitempty"`
	Duration string                 `json:"duration"`
}

// Finding is a schedule that failed, and what shrinking made of it.
type Finding struct {
	Round    int                       `json:"round"`
	Schedule Schedule                  `json:"schedule"`
	Kinds    []conformance.FailureKind `json:"kinds"`
	Reason   string                    `json:"reason"`
	// After is how long the run had gone, its first round's start to the end of this
	// one: the time it took to find it.
	After string `json:"after"`
	// Shrunk is the smallest schedule found that still fails in the same way (Kinds),
	// ShrinkRuns the replays it took; Replayed is the last failing replay of it.
	Shrunk     *Schedule           `json:"shrunk,omitempty"`
	ShrinkRuns int                 `json:"shrinkRuns,omitempty"`
	Replayed   *conformance.Result `json:"-"`
	Result     conformance.Result  `json:"-"`
}

// Run is what a fuzz run did.
type Run struct {
	Seed     uint64   `json:"seed"`
	Rounds   []Round  `json:"rounds"`
	Finding  *Finding `json:"finding,omitempty"`
	Duration string   `json:"duration"`
	// Results are every round's results, then the shrunk schedule's last replay.
	Results []conformance.Result `json:"-"`
}

// Violations counts the rounds that failed.
func (r Run) Violations() int {
	n := 0
	for _, rd := range r.Rounds {
		if rd.Result == conformance.Failed {
			n++
		}
	}
	return n
}

// Fuzz runs rounds of schedules drawn from o.Seed against r's implementation, each in
// a fresh world, until one fails or the rounds (or the time) are up, and shrinks the
// failing schedule. A round that errs is an error of the environment: the run
// reports it and goes on, but three in a row end it.
func Fuzz(ctx context.Context, r *conformance.Runner, o Options) (run Run, err error) {
	o = withDefaults(o)
	run.Seed = o.Seed
	start := time.Now()
	defer func() { run.Duration = time.Since(start).Round(time.Second).String() }()
	claims := ClaimsOf(r.Info())
	errs := 0
	for round := 1; o.Rounds == 0 || round <= o.Rounds; round++ {
		if o.Duration > 0 && time.Since(start) >= o.Duration {
			break
		}
		if ctx.Err() != nil {
			return run, ctx.Err()
		}
		s := Generate(o.Seed, round, claims, o.Steps, o.Span)
		s.ConnectInterval, s.Mode = Offset(o.ConnectInterval), o.Mode
		o.Logf("round %d of seed %d:\n%s", round, o.Seed, s)
		res := r.Run(ctx, Spec(s, r.Info()))
		run.Results = append(run.Results, res)
		run.Rounds = append(run.Rounds, Round{Round: round, Steps: len(s.Actions), Result: res.Result, Reason: res.Reason, Duration: res.Duration.String()})
		switch res.Result {
		case conformance.Failed:
			f := &Finding{Round: round, Schedule: s, Kinds: res.FailedKinds(), Reason: res.Reason, After: time.Since(start).Round(time.Second).String(), Result: res}
			run.Finding = f
			o.Logf("round %d found a violation after %s: %s", round, f.After, res.Reason)
			if o.Shrink {
				shrink(ctx, r, o, f)
				if f.Replayed != nil {
					run.Results = append(run.Results, *f.Replayed)
				}
			}
			return run, nil
		case conformance.Errored:
			if errs++; errs == 3 {
				return run, fmt.Errorf("three rounds in a row erred, the last: %s", res.Reason)
			}
		default:
			errs = 0
		}
	}
	return run, nil
}

func withDefaults(o Options) Options {
	if o.Steps <= 0 {
		o.Steps = DefaultSteps
	}
	if o.Span <= 0 {
		o.Span = DefaultSpan
	}
	if o.Replays <= 0 {
		o.Replays = DefaultReplays
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// Replay runs s once, in a fresh world.
func Replay(ctx context.Context, r *conformance.Runner, s Schedule) conformance.Result {
	return r.Run(ctx, Spec(s, r.Info()))
}

// shrink reduces f's schedule: a candidate still fails when a replay of it fails in
// one of the ways the original did (a kind in common), in at most o.Replays runs.
func shrink(ctx context.Context, r *conformance.Runner, o Options, f *Finding) {
	fails := func(actions []Action) bool {
		s := f.Schedule
		s.Actions = actions
		if vanishOrder(actions) != nil {
			return false // a spare vanishing in its Service: no world runs it
		}
		for i := range o.Replays {
			if ctx.Err() != nil {
				return false
			}
			f.ShrinkRuns++
			// A replay of its own name: the failing round's timeline and
			// diagnostics stay as they were, for whoever reads the finding.
			sp := Spec(s, r.Info())
			sp.ID = fmt.Sprintf("%s-shrink-%d", sp.ID, f.ShrinkRuns)
			res := r.Run(ctx, sp)
			failed := res.Result == conformance.Failed && slices.ContainsFunc(res.FailedKinds(), func(k conformance.FailureKind) bool { return slices.Contains(f.Kinds, k) })
			o.Logf("shrink: %d steps, replay %d of %d: %s %s", len(actions), i+1, o.Replays, res.Result, res.Reason)
			if failed {
				f.Replayed = &res
				return true
			}
		}
		return false
	}
	actions := f.Schedule.Actions
	// The steps whose own span the round failed in are tried alone first: a window
	// a step opens by chance (one burst in tens meets it) is found again in a
	// replay of that step about as often as in one of the whole round, and ddmin
	// would spend its replays on halves that hold it as well.
	if blame := f.Schedule.blamed(f.Result); len(blame) > 0 && len(blame) < len(actions) {
		if fails(blame) {
			actions = blame
		}
	}
	actions = Minimize(actions, fails)
	actions = tighten(actions, fails)
	shrunk := f.Schedule
	shrunk.Actions = actions
	f.Shrunk = &shrunk
}

// spanCheck matches the name of a check of one step's span (its burst, its churn),
// as round.go names them: "every new connection of step 4's burst ...".
var spanCheck = regexp.MustCompile(`\bstep (\d+)'s (?:burst|churn)\b`)

// blamed are the steps of s whose own span a failed check of res judged, in order,
// with the join that put in its Service each spare a blamed step takes out (its
// burst goes to that Service): the smallest schedule that may fail as res did.
// None where no failed check judged one step's span.
func (s Schedule) blamed(res conformance.Result) []Action {
	keep := map[int]bool{}
	for _, c := range res.Checks {
		m := spanCheck.FindStringSubmatch(c.Name)
		if c.Passed || m == nil {
			continue
		}
		i, err := strconv.Atoi(m[1])
		if err != nil || i < 1 || i > len(s.Actions) {
			continue
		}
		keep[i-1] = true
		if s.Actions[i-1].Op == OpLeave {
			for j := i - 2; j >= 0; j-- {
				if a := s.Actions[j]; a.Backend == s.Actions[i-1].Backend && (a.Op == OpJoin || a.Op == OpLeave) {
					if a.Op == OpJoin {
						keep[j] = true
					}
					break
				}
			}
		}
	}
	var out []Action
	for i, a := range s.Actions {
		if keep[i] {
			out = append(out, a)
		}
	}
	return out
}

// Minimize is delta debugging (Zeller's ddmin) over a schedule's steps: it returns a
// subsequence of actions that still fails, from which no one step can be removed
// (1-minimal) as far as fails can tell. Steps keep their offsets.
func Minimize(actions []Action, fails func([]Action) bool) []Action {
	// A subsequence is tried once: ddmin comes back to some.
	tried := map[string]bool{}
	fails = func(try func([]Action) bool) func([]Action) bool {
		return func(as []Action) bool {
			key := fmt.Sprint(as)
			if r, ok := tried[key]; ok {
				return r
			}
			tried[key] = try(as)
			return tried[key]
		}
	}(fails)
	n := 2
	for len(actions) >= 2 {
		chunks := split(actions, n)
		if i := slices.IndexFunc(chunks, fails); i >= 0 {
			actions, n = chunks[i], 2
			continue
		}
		// With two chunks, each one's complement is the other, tried already.
		if n > 2 {
			if c, ok := failingComplement(chunks, fails); ok {
				actions, n = c, max(n-1, 2)
				continue
			}
		}
		if n >= len(actions) {
			break
		}
		n = min(2*n, len(actions))
	}
	return actions
}

func failingComplement(chunks [][]Action, fails func([]Action) bool) ([]Action, bool) {
	for i := range chunks {
		var c []Action
		for j, ch := range chunks {
			if j != i {
				c = append(c, ch...)
			}
		}
		if fails(c) {
			return c, true
		}
	}
	return nil, false
}

// split cuts actions into n chunks of nearly equal length.
func split(actions []Action, n int) [][]Action {
	out := make([][]Action, 0, n)
	for i := range n {
		lo, hi := i*len(actions)/n, (i+1)*len(actions)/n
		if lo < hi {
			out = append(out, slices.Clone(actions[lo:hi]))
		}
	}
	return out
}

// tighten shrinks a minimal schedule's timing: the first step moved to the start,
// then every gap between steps halved, for as long as it still fails.
func tighten(actions []Action, fails func([]Action) bool) []Action {
	if len(actions) == 0 {
		return actions
	}
	if first := actions[0].At; first > 0 {
		shifted := slices.Clone(actions)
		for i := range shifted {
			shifted[i].At -= first
		}
		if fails(shifted) {
			actions = shifted
		}
	}
	for range 3 {
		if len(actions) < 2 || actions[len(actions)-1].At-actions[0].At < Offset(100*time.Millisecond) {
			break
		}
		halved := slices.Clone(actions)
		for i := range halved {
			halved[i].At = actions[0].At + (actions[i].At-actions[0].At)/2
		}
		if !fails(halved) {
			break
		}
		actions = halved
	}
	return actions
}
