package fuzz

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/probe"
	"github.com/dpconform/dpconform/fv/timeline"
)

// backendModel says which backends may answer an attempt of the named probe that
// started at start and was answered at answered (model.allowed); an empty answer
// allows any.
type backendModel func(probe string, start, answered monotime.Time) []string

// leavingModel says whether backend may answer an attempt of the named probe that
// started at t only because it left the Service within its budget (model.leaving).
type leavingModel func(probe string, t monotime.Time, backend string) bool

// answersAsModelled is the round's check that every new connection and every UDP
// flow's datagram that was answered was answered by a backend the model allowed
// then (and a datagram from the address it was sent to): a backend that left a
// Service gets nothing new once the change had its time to be programmed, and one
// not yet in it nothing before. It judges the probes the model knows a Service of.
// Failed attempts are the per-path checks', which also find a blind probe (they run
// first, on the same window); this one judges only answers. A violation is of kind
// wrong-backend (or wrong-reply). A reply from the wrong address by a backend that
// is leaving (a reply that crossed its flow's deletion) is not one.
type answersAsModelled struct {
	model   backendModel
	leaving leavingModel
	modelReport
}

func newAnswersAsModelled(model backendModel, leaving leavingModel) *answersAsModelled {
	return &answersAsModelled{model: model, leaving: leaving, modelReport: modelReport{
		expected: "every answer from a backend the model allowed", negated: "an answer from a backend the model did not allow"}}
}

// modelReport is what the model's checks report alike: the window they judged,
// their result, and the failure's detail, in the matchers' wording.
type modelReport struct {
	expected, negated string // "every answer from ..."

	w      timeline.Window
	res    matchers.Result
	detail string
}

func (r *modelReport) Result() matchers.Result { return r.res }

func (r *modelReport) FailureMessage(any) string {
	return fmt.Sprintf("Expected %s in the %s, but:\n  ✗ %s\nFirst violation: %s\n%s", r.expected, r.w, r.res.Figures[0].Text, r.res.First, r.detail)
}

func (r *modelReport) NegatedFailureMessage(any) string {
	return fmt.Sprintf("Expected %s in the %s, but:\n  %s\n", r.negated, r.w, r.res.Figures[0].Text)
}

// wrongAttempt is an attempt a model's check found not as the model says: why
// ("was denied (...) but delivered"), and its kind.
type wrongAttempt struct {
	e    probe.Event
	kind matchers.Kind
	why  string
}

// window takes the window the check judges, and forgets the last judgement.
func (r *modelReport) window(actual any) (timeline.Window, error) {
	w, ok := actual.(timeline.Window)
	if !ok {
		return w, fmt.Errorf("fuzz: expected a timeline.Window, got %T", actual)
	}
	r.w, r.detail = w, ""
	return w, nil
}

// judge sets the check's result: its one figure, name, the count of wrong among
// judged attempts (text says what they are: "judged attempts on the spare address
// not as its changes say"), and the violation if wrong, in time order, is not empty:
// the first of them with the timeline around it, and the list. It reports whether
// the check passed.
func (r *modelReport) judge(w timeline.Window, name, text string, judged int, wrong []wrongAttempt) bool {
	zero := 0.0
	r.res = matchers.Result{Verdict: matchers.Pass, Figures: []matchers.Figure{{Name: name, Value: float64(len(wrong)), Unit: "attempts", Of: judged, Budget: &zero,
		Text: fmt.Sprintf("%d of %d %s (budget 0)", len(wrong), judged, text)}}}
	if len(wrong) == 0 {
		return true
	}
	first := wrong[0]
	r.res.Verdict, r.res.Kind, r.res.At = matchers.Violation, first.kind, first.e.Time
	r.res.First = fmt.Sprintf("probe %s, started %s: attempt #%d to %s %s", first.e.Probe, w.Relative(first.e.Time), first.e.Seq, first.e.Target, first.why)
	type attempt struct {
		probe string
		seq   uint64
	}
	marked := map[attempt]bool{}
	for i, x := range wrong {
		marked[attempt{x.e.Probe, x.e.Seq}] = true
		if i < matchers.MaxMarks {
			r.res.Marks = append(r.res.Marks, matchers.Mark{Probe: x.e.Probe, Time: x.e.Time, Kind: x.kind})
		}
	}
	r.res.MarksTotal = len(wrong)
	var b strings.Builder
	b.WriteString("Timeline around it:\n")
	b.WriteString(w.Excerpt(first.e.Time, matchers.DefaultContext, matchers.DefaultContext, func(e probe.Event) bool {
		switch e.Kind {
		case probe.KindAttempt, probe.KindReply:
			return marked[attempt{e.Probe, e.Seq}]
		case probe.KindSent, probe.KindRecv: // a UDP pair's datagram by its label, or a flow's
			return marked[attempt{e.Target, e.Seq}] || marked[attempt{e.Probe, e.Seq}]
		}
		return false
	}))
	list(&b, "Attempts not as modelled:", len(wrong), func(i int) string {
		x := wrong[i]
		return fmt.Sprintf("%s #%d started %s: %s (%s)", x.e.Probe, x.e.Seq, w.Relative(x.e.Time), x.why, x.kind)
	})
	r.detail = b.String()
	return false
}

// blind makes the check's result the instrument's failure, first: its figure stays,
// nothing else of a violation it may have judged.
func (r *modelReport) blind(first string) {
	r.res = matchers.Result{Verdict: matchers.Instrument, Figures: r.res.Figures, First: first}
	r.detail = ""
}

// list writes title and the first 20 of n lines, then how many more there are.
func list(b *strings.Builder, title string, n int, line func(i int) string) {
	b.WriteString(title + "\n")
	for i := range min(n, 20) {
		b.WriteString("  " + line(i) + "\n")
	}
	if n > 20 {
		fmt.Fprintf(b, "  ... and %d more\n", n-20)
	}
}

// WithDefaults keeps the matcher as it is: its options are its own (a round's
// hosts share the suite's clock, so it allows no slack).
func (m *answersAsModelled) WithDefaults(...matchers.Option) matchers.Matcher { return m }

func (m *answersAsModelled) Match(actual any) (bool, error) {
	w, err := m.window(actual)
	if err != nil {
		return false, err
	}
	var wrong []wrongAttempt
	answered := 0
	for _, e := range w.Inside() {
		answer := (e.Kind == probe.KindAttempt && e.Outcome == probe.OK) ||
			(e.Kind == probe.KindReply && (e.Outcome == probe.OK || e.Outcome == probe.WrongReply))
		if !answer {
			continue
		}
		// A round's hosts share the suite's clock: the attempt's start and its
		// answer's time (Latency is from the start) bound it, with no slack.
		ok := m.model(e.Probe, e.Time, e.Time.Add(e.Latency))
		if len(ok) == 0 {
			continue
		}
		answered++
		switch {
		case e.Outcome == probe.WrongReply && m.leaving(e.Probe, e.Time, e.Backend):
		case e.Outcome == probe.WrongReply:
			wrong = append(wrong, wrongAttempt{e, matchers.KindWrongReply, fmt.Sprintf("answered by %s, but %s", e.Backend, e.Err)})
		case !slices.Contains(ok, e.Backend):
			wrong = append(wrong, wrongAttempt{e, matchers.KindWrongBackend,
				fmt.Sprintf("answered by %s, which the model did not allow then (allowed: %s)", e.Backend, strings.Join(ok, " or "))})
		}
	}
	return m.judge(w, "unmodelled_answers", "answers (connections and datagrams) from a backend the model did not allow then", answered, wrong), nil
}
