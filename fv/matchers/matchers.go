// Package matchers states the suite's invariants as Gomega matchers over a timeline
// window: no failed attempt, bounded stream gaps, no reset, alive at the end, nothing
// delivered, and delivery ordered after a control peer.
//
// Each matcher keeps what it measured (Result: figures next to their budgets) for the
// report, and on failure prints for a person the timeline around the first violation,
// relative to the transition events. A matcher whose probes did not cover the window
// (a probe crashed, stopped early, or was starved) returns an error instead of a
// verdict: the instrument failed, the implementation is not charged, and the assertion
// fails whether it was negated or not.
//
// The actual value is a timeline.Window (or *timeline.Window). Take it once the probes
// have reported past its end: stop them, or wait for their watermarks
// (probe.Process.WaitMark), receivers up to the end plus the Grace.
package matchers

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/onsi/gomega/types"

	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// Figure is one measured figure, with its budget when it has one.
type Figure struct {
	Name   string   `json:"name"`
	Value  float64  `json:"value"`
	Unit   string   `json:"unit"`
	Of     int      `json:"of,omitempty"`
	Budget *float64 `json:"budget,omitempty"`
	Text   string   `json:"text"`
}

// Within reports whether the figure is within its budget (always, without one).
func (f Figure) Within() bool { return f.Budget == nil || f.Value <= *f.Budget }

// Verdict is the kind of result a matcher reached.
type Verdict string

// Verdicts.
const (
	Pass         Verdict = "pass"
	Violation    Verdict = "violation"    // the invariant does not hold
	Precondition Verdict = "precondition" // what the invariant needs never happened (e.g. no control delivery)
	Instrument   Verdict = "instrument"   // the probes did not cover the window: an environment error
)

// Kind says how an invariant failed. It is part of every matcher's Result: a
// Violation always carries the kind of what was measured (the contract the suite's
// report and self-test rely on), a Precondition carries KindPrecondition, a pass none.
type Kind string

// Kinds of failure. The attempt kinds map the probe's outcomes one to one, so that
// every outcome a probe can record has its kind; wrong-backend means only a reply from
// a backend the check did not allow.
const (
	KindReset        Kind = "reset"         // a RST: refused connect, or reset stream or attempt
	KindTimeout      Kind = "timeout"       // no answer within the attempt timeout
	KindUnreachable  Kind = "unreachable"   // ICMP unreachable or no route
	KindNoReply      Kind = "no-reply"      // the peer closed without replying
	KindWrongReply   Kind = "wrong-reply"   // a reply that is not the protocol's
	KindWrongBackend Kind = "wrong-backend" // a reply from a backend the check did not allow
	KindSkipped      Kind = "skipped"       // the probe skipped attempts: too many in flight
	KindLocalError   Kind = "local-error"   // the client could not even try (ports, descriptors)
	KindGap          Kind = "gap"           // a stream stalled beyond its budget
	KindNotAlive     Kind = "not-alive"     // a stream that should be alive is dead
	KindHang         Kind = "hang"          // a stream that should have ended is still silent
	KindDelivered    Kind = "delivered"     // traffic that must be denied got through
	KindVerdict      Kind = "verdict"       // a policy verdict that must not be reported was
	KindLost         Kind = "lost"          // traffic that must be delivered was not
	KindUnserved     Kind = "unserved"      // a backend that should answer answered nothing
	KindPrecondition Kind = "precondition"  // what the invariant needs never happened
)

// Result is what a matcher measured in its last Match.
type Result struct {
	Verdict Verdict `json:"verdict"`
	// Kind is how the invariant failed; empty on a pass.
	Kind    Kind     `json:"kind,omitempty"`
	Figures []Figure `json:"figures"`
	// First is the first violation in one line; empty on a pass. At is when it
	// happened (zero when the violation is an absence, e.g. no stream on a backend).
	First string        `json:"first,omitempty"`
	At    monotime.Time `json:"at,omitempty"`
	// Marks are the moments in breach of the invariant, in time order, at most
	// MaxMarks of them; MarksTotal counts them all.
	Marks      []Mark `json:"marks,omitempty"`
	MarksTotal int    `json:"marksTotal,omitempty"`
	// Window is the window judged, when From narrowed the one given to Match.
	Window string `json:"window,omitempty"`
}

// Mark is a moment (or a span) of the timeline that a check found in breach of its
// invariant, for a chart to draw on the lane of the probe it concerns: a failed
// attempt, a stream's gap over its budget, a datagram lost, a request delivered that
// must not have been, a policy verdict that must not have been reported.
type Mark struct {
	// Probe is the lane: the probe that sent what is marked (empty for a verdict).
	Probe  string `json:"p,omitempty"`
	Stream int    `json:"s,omitempty"`
	// Node is the node that reported a marked policy verdict.
	Node string        `json:"node,omitempty"`
	Time monotime.Time `json:"t"`
	// End closes a span (a gap, a stream that hangs); zero for a moment.
	End  monotime.Time `json:"t1,omitempty"`
	Kind Kind          `json:"k"`
}

// MaxMarks bounds the marks a Result keeps: a chart draws them per pixel, and a
// failure of thousands says what it is in its first few thousand.
const MaxMarks = 5000

// Matcher is a Gomega matcher that keeps its measurement.
type Matcher interface {
	types.GomegaMatcher
	// Result is what the last Match measured.
	Result() Result
	// WithDefaults returns the matcher with defaults applied before its own options:
	// the suite passes its budgets (MaxBlind, Within, ...) this way, and an option the
	// matcher was built with still wins.
	WithDefaults(opts ...Option) Matcher
}

// ErrInstrument wraps the error a matcher returns when its probes did not cover the
// window.
var ErrInstrument = errors.New("instrument error")

// ErrBlind is the instrument error of a probe that was not running (the machine did
// not schedule it, or it was stopped) for longer than MaxBlind inside the window: the
// window cannot be judged, and nothing in it is a verdict on the implementation.
var ErrBlind = errors.New("the instrument was blind")

// Option tunes a matcher.
type Option func(*options)

type options struct {
	probes     []string
	onBackends []string
	backends   []string
	to         []string
	flows      [][2]string // src, dst of policy verdicts
	allow      int
	maxBlind   time.Duration
	within     time.Duration
	grace      time.Duration
	context    time.Duration
	fromEvent  string // with From: judge only from fromAfter past this event
	fromAfter  time.Duration
	mayStop    bool          // senders that stopped cleanly are judged on what they sent
	clock      time.Duration // ClockUncertainty
}

// Defaults of the options.
const (
	DefaultMaxBlind = 250 * time.Millisecond
	DefaultWithin   = 500 * time.Millisecond
	DefaultGrace    = 100 * time.Millisecond
	DefaultContext  = 100 * time.Millisecond
)

func defaults() options {
	return options{maxBlind: DefaultMaxBlind, within: DefaultWithin, grace: DefaultGrace, context: DefaultContext}
}

// Probes restricts a matcher to the probes with these names (senders, for the
// delivery matchers). Default: every probe of the role the matcher is about.
func Probes(names ...string) Option {
	return func(o *options) { o.probes = append(o.probes, names...) }
}

// SendersMayStop lets the selected senders stop before the window ends: one that
// stopped cleanly (its probe asked to stop, and exited so) is judged on what it sent,
// for it sent nothing after. For the delivery matchers of a spec that stops a sender
// once it has served its purpose (a new pod's first packets); any other sender must
// report through the window's end.
func SendersMayStop() Option {
	return func(o *options) { o.mayStop = true }
}

// Backends lists the servers allowed to answer; an answer from another one is a failed
// attempt ("wrong backend").
func Backends(names ...string) Option {
	return func(o *options) { o.backends = append(o.backends, names...) }
}

// To restricts the delivery matchers to requests whose destination label is one of
// these.
func To(labels ...string) Option { return func(o *options) { o.to = append(o.to, labels...) } }

// Allow sets the budget of failed attempts (default 0).
func Allow(n int) Option { return func(o *options) { o.allow = n } }

// MaxBlind is the longest a connect probe may go without starting an attempt before
// the matcher calls the instrument blind (default 250 ms).
func MaxBlind(d time.Duration) Option { return func(o *options) { o.maxBlind = d } }

// Within is how recent a stream's last echo must be at the window end to count as
// alive (default 500 ms).
func Within(d time.Duration) Option { return func(o *options) { o.within = d } }

// Grace is how long after the window end receivers must have reported, for requests
// still in flight at the end (default 100 ms).
func Grace(d time.Duration) Option { return func(o *options) { o.grace = d } }

// Context is how much timeline a failure message shows on each side of the first
// violation (default 100 ms).
func Context(d time.Duration) Option { return func(o *options) { o.context = d } }

// OnBackends restricts the stream matchers (HaveStreamGapsWithin, HaveNoResets,
// BeAliveAtEnd, HaveStreamsEndedWithin) to streams answered by these backends, as
// their echoes name them: for a Service, the dataplane picks the backend, so a spec
// can only sort streams after the fact. HaveNoResets then ignores connect attempts.
// HaveZeroDelivered counts only what these backends received or answered.
func OnBackends(names ...string) Option {
	return func(o *options) { o.onBackends = append(o.onBackends, names...) }
}

// From narrows the window a matcher judges to its part from after past the first
// transition event named event inside it: a spec whose invariant holds only once the
// implementation is ready (From(timeline.Ready, 0)), or within a budget of it, is
// judged from there on, while the window still places every event relative to the
// whole transition. A window without that event, or one that ends before the moment,
// is an instrument error: the invariant was not measured.
func From(event string, after time.Duration) Option {
	return func(o *options) { o.fromEvent, o.fromAfter = event, after }
}

// ClockUncertainty is how far a probe's event may be from its true time on the
// suite's clock, when the probe's host reads a clock of its own (package clocks):
// no verdict may hang on which side of a transition such an event fell. So every
// time allowed after a transition event is longer by it: a check From an event starts
// that much later, a deadline (HaveStreamsEndedWithin, HaveDatagramsAnsweredWithin,
// HaveServedWithin) is that much later, and a stream is alive with an echo that much
// older (Within). Zero, the default, on a world of one clock.
func ClockUncertainty(d time.Duration) Option {
	return func(o *options) { o.clock = d }
}

// narrow applies From to w.
func narrow(w timeline.Window, o options) (timeline.Window, error) {
	if o.fromEvent == "" {
		return w, nil
	}
	for _, t := range w.Transitions {
		if t.Name != o.fromEvent || !w.Contains(t.Time) {
			continue
		}
		start := t.Time.Add(o.fromAfter + o.clock)
		if start >= w.End {
			return w, fmt.Errorf("the %s ends before %s after %s, where the check starts", w, fmtMs(o.fromAfter), o.fromEvent)
		}
		w.Start = max(w.Start, start)
		return w, nil
	}
	return w, fmt.Errorf("no %q event in the %s, from which the check starts", o.fromEvent, w)
}

// streamSelected reports whether a stream's backend is selected by OnBackends.
func (o options) streamSelected(backend string) bool {
	if len(o.onBackends) == 0 {
		return true
	}
	for _, b := range o.onBackends {
		if b == backend {
			return true
		}
	}
	return false
}

func (o options) selected(name string) bool {
	if len(o.probes) == 0 {
		return true
	}
	for _, p := range o.probes {
		if p == name {
			return true
		}
	}
	return false
}

func (o options) toSelected(label string) bool {
	if len(o.to) == 0 {
		return true
	}
	for _, l := range o.to {
		if l == label {
			return true
		}
	}
	return false
}

func toWindow(actual any) (timeline.Window, error) {
	switch a := actual.(type) {
	case timeline.Window:
		return a, nil
	case *timeline.Window:
		if a != nil {
			return *a, nil
		}
	}
	return timeline.Window{}, fmt.Errorf("matchers: expected a timeline.Window, got %T", actual)
}

// transition is the time of the first transition event named name.
func transition(w timeline.Window, name string) (monotime.Time, bool) {
	for _, t := range w.Transitions {
		if t.Name == name {
			return t.Time, true
		}
	}
	return 0, false
}

// outcome is what an evaluation found.
type outcome struct {
	verdict Verdict
	kind    Kind // of a violation; the matcher's own kind when empty
	figures []Figure
	first   string        // one line
	at      monotime.Time // when the first violation happened
	marks   []Mark        // every moment in breach, for charts
	detail  string        // the rest of the message: excerpt, other violations
}

// matcher is the shared Gomega plumbing; eval does the measuring.
type matcher struct {
	what string // the invariant, e.g. "no failed connection attempt"
	kind Kind   // of a violation, unless eval names a more precise one
	opts options
	eval func(w timeline.Window, o options) (outcome, error)

	given []Option // as built, for WithDefaults
	w     timeline.Window
	out   outcome
}

func newMatcher(what string, kind Kind, opts []Option, eval func(timeline.Window, options) (outcome, error)) *matcher {
	m := &matcher{what: what, kind: kind, eval: eval, given: opts}
	m.opts = resolve(nil, opts)
	return m
}

func resolve(defs, given []Option) options {
	o := defaults()
	for _, f := range defs {
		f(&o)
	}
	for _, f := range given {
		f(&o)
	}
	return o
}

func (m *matcher) WithDefaults(opts ...Option) Matcher {
	c := *m
	c.opts = resolve(opts, m.given)
	return &c
}

func (m *matcher) Match(actual any) (bool, error) {
	w, err := toWindow(actual)
	if err != nil {
		return false, err
	}
	m.w = w
	if w, err = narrow(w, m.opts); err != nil {
		m.out = outcome{verdict: Instrument, first: err.Error()}
		return false, fmt.Errorf("%w: cannot check %s: %w", ErrInstrument, m.what, err)
	}
	m.w = w
	m.out, err = m.eval(w, m.opts)
	if err != nil {
		m.out = outcome{verdict: Instrument, first: err.Error()}
		return false, fmt.Errorf("%w: cannot check %s in the %s: %w", ErrInstrument, m.what, w, err)
	}
	switch m.out.verdict {
	case Pass:
		m.out.kind = ""
	case Precondition:
		m.out.kind = KindPrecondition
	case Violation:
		if m.out.kind == "" {
			m.out.kind = m.kind
		}
		for i := range m.out.marks {
			if m.out.marks[i].Kind == "" {
				m.out.marks[i].Kind = m.out.kind
			}
		}
		sort.SliceStable(m.out.marks, func(i, j int) bool { return m.out.marks[i].Time < m.out.marks[j].Time })
	}
	return m.out.verdict == Pass, nil
}

func (m *matcher) FailureMessage(any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Expected %s in the %s, but:\n", m.what, m.w)
	for _, f := range m.out.figures {
		mark := "  "
		if !f.Within() {
			mark = "✗ "
		}
		fmt.Fprintf(&b, "  %s%s\n", mark, f.Text)
	}
	if m.out.verdict == Precondition {
		b.WriteString("PRECONDITION NOT MET: ")
	} else {
		b.WriteString("First violation: ")
	}
	b.WriteString(m.out.first)
	b.WriteString("\n")
	b.WriteString(m.out.detail)
	return b.String()
}

func (m *matcher) NegatedFailureMessage(any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Expected a violation of %s in the %s, but it held:\n", m.what, m.w)
	for _, f := range m.out.figures {
		fmt.Fprintf(&b, "    %s\n", f.Text)
	}
	return b.String()
}

func (m *matcher) Result() Result {
	r := Result{Verdict: m.out.verdict, Kind: m.out.kind, Figures: m.out.figures, First: m.out.first, At: m.out.at}
	if m.out.verdict == Violation {
		r.Marks, r.MarksTotal = m.out.marks[:min(len(m.out.marks), MaxMarks)], len(m.out.marks)
	}
	if m.opts.fromEvent != "" && m.w.End != 0 {
		r.Window = m.w.String()
	}
	return r
}

func budget(v float64) *float64 { return &v }

// markOf marks an event of a probe as a breach of kind (the matcher's own, if empty).
func markOf(e probe.Event, kind Kind) Mark {
	return Mark{Probe: e.Probe, Stream: e.Stream, Time: e.Time, Kind: kind}
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

// probeState is what the timeline says about one probe's life.
type probeState struct {
	name     string
	role     probe.Role
	ready    monotime.Time
	reported monotime.Time // latest watermark or clean stop
	stopped  bool          // reported its stop (KindDone)
	exit     *probe.Event
	errs     []probe.Event
}

func probesOf(w timeline.Window) map[string]*probeState {
	ps := map[string]*probeState{}
	get := func(n string) *probeState {
		p := ps[n]
		if p == nil {
			p = &probeState{name: n}
			ps[n] = p
		}
		return p
	}
	for i := range w.Events {
		e := &w.Events[i]
		p := get(e.Probe)
		switch e.Kind {
		case probe.KindReady:
			if p.ready == 0 {
				p.ready = e.Time
			}
			p.role = e.Role
		case probe.KindMark, probe.KindDone:
			p.reported = max(p.reported, e.Time)
			p.stopped = p.stopped || e.Kind == probe.KindDone
		case probe.KindExit:
			p.exit = e
		case probe.KindError:
			p.errs = append(p.errs, *e)
		case probe.KindAttempt:
			p.role = cmpOr(p.role, probe.RoleConnect)
		case probe.KindOpen, probe.KindEcho, probe.KindEnd, probe.KindGap:
			p.role = cmpOr(p.role, probe.RoleStream)
		case probe.KindSent:
			p.role = cmpOr(p.role, probe.RoleUDP)
		case probe.KindRecv:
			p.role = cmpOr(p.role, probe.RoleServe)
		}
	}
	return ps
}

func cmpOr(r, def probe.Role) probe.Role {
	if r == "" {
		return def
	}
	return r
}

// ofRole returns the selected probes of a role, sorted by name.
func ofRole(ps map[string]*probeState, role probe.Role, o options) []*probeState {
	var out []*probeState
	for _, p := range ps {
		if p.role == role && o.selected(p.name) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// covers checks that probe p reported everything up to through and, with
// fromStart, was ready by the window start.
func covers(w timeline.Window, p *probeState, fromStart bool, through monotime.Time) error {
	return coversOr(w, p, fromStart, through, false)
}

// stoppedCleanly reports whether p stopped when asked and exited so: everything it
// did is on the timeline.
func (p *probeState) stoppedCleanly() bool {
	return p.stopped && p.exit != nil && p.exit.Outcome == probe.OK
}

// coversOr is covers, which with mayStop also accepts a probe that stopped cleanly
// before through.
func coversOr(w timeline.Window, p *probeState, fromStart bool, through monotime.Time, mayStop bool) error {
	if p.ready == 0 {
		return fmt.Errorf("probe %s never reported ready", p.name)
	}
	if fromStart && p.ready > w.Start {
		return fmt.Errorf("probe %s was ready only %s, after the window start", p.name, w.Relative(p.ready))
	}
	if p.reported >= through || mayStop && p.stoppedCleanly() {
		return nil
	}
	why := "it is still running: wait for its watermark (Process.WaitMark) or stop it before checking"
	if p.exit != nil {
		why = "its process ended: " + timeline.Describe(*p.exit)
	}
	last := "nothing"
	if p.reported != 0 {
		last = w.Relative(p.reported)
	}
	return fmt.Errorf("probe %s has reported only up to %s, short of %s: %s", p.name, last, w.Relative(through), why)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
