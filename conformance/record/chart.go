package record

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/dpconform/dpconform/conformance"
	"github.com/dpconform/dpconform/fv/matchers"
	"github.com/dpconform/dpconform/fv/monotime"
	"github.com/dpconform/dpconform/fv/timeline"
)

// A chart draws one scenario of a spec's run as report.html shows it: a lane per
// probe, time left to right, each probe's attempts, streams, datagrams or receipts
// as marks coloured by outcome, the transition events as labelled vertical lines,
// the steady state and the checked window shaded, and on top of each lane the
// moments the failed checks found in breach, the first of each check pointed out.
//
// The chart is geometry only; report.html.tmpl writes it as inline SVG with
// html/template, so every name in it is escaped. Marks are drawn per pixel column,
// and nearby columns of one kind make one mark that carries its count (data-n) and
// one tooltip: a chart stays a few hundred elements whether a lane saw 10 or 30,000
// attempts, and its failure marks still add up to the measured figures.

// Chart geometry, in SVG user units (the page scales the SVG to its width).
const (
	chartWidth  = 1200
	chartLeft   = 200 // lane labels
	chartRight  = 16
	chartPlot   = chartWidth - chartLeft - chartRight
	laneGap     = 6
	breachStrip = 5 // the strip above a lane where breaches are marked
	labelRow    = 13
	axisHeight  = 34
)

type chartView struct {
	ID     string
	Kind   string // overview or zoom
	Title  string
	Width  int
	Height int
	// PlotTop and PlotBottom bound the lanes; the windows and event lines span them.
	PlotTop, PlotBottom int
	PlotHeight          int
	PlotWidth           int
	Left, Right         int
	LabelX              int
	Bands               []bandView
	Ticks               []tickView
	AxisY               int
	TickY, TickLabelY   int
	AxisTitleX          int
	AxisTitleY          int
	AxisTitle           string
	Lanes               []laneView
	Events              []eventView
	Firsts              []firstView
	Omitted             []string // lanes left out, by name
}

// bandView is a window of the scenario: a labelled bracket above the lanes and, for
// the checked window, a shade behind them.
type bandView struct {
	X, W   string
	Class  string
	Label  string
	LabelX string
	// BarY is the bracket's row; Shade, whether the window shades the lanes.
	BarY, LabelY int
	Shade        bool
	Title        string
}

type tickView struct {
	X     string
	Label string
}

type laneView struct {
	Name  string
	Role  string
	Y, H  int
	MidY  int
	NameY int
	SubY  int
	Label string
	Sub   string
	Title string
	Rects []rectView
}

// rectView is one mark: runs of columns of one kind that lie close together, drawn
// as rectangles under one tooltip, with their count (N). A close-up draws each
// connection on its own, and a tooltip per connection would make a page megabytes.
type rectView struct {
	Y, H  string
	Class string
	Kind  string
	Check string
	N     int
	Title string
	Parts []partView
}

type partView struct{ X, W string }

// markGap is how far apart (in columns) runs of one kind may lie and still be one
// mark.
const markGap = 6

// marksOf groups runs into marks of class at y0, hh high; what(n) says what a mark of
// n is, and its span where it lies.
func (s scale) marksOf(rel timeline.Window, runs []colRun, y0, hh int, class, kind string, what func(n int) string) []rectView {
	var out []rectView
	var cur *rectView
	var first, last colRun
	flush := func() {
		if cur != nil {
			cur.Title = what(cur.N) + " " + s.span(rel, colRun{first.from, last.to, cur.N})
			out = append(out, *cur)
		}
	}
	for _, r := range runs {
		if cur == nil || r.from-last.to > markGap {
			flush()
			cur = &rectView{Y: fmt.Sprint(y0), H: fmt.Sprint(hh), Class: class, Kind: kind}
			first = r
		}
		w := float64(r.to - r.from + 1)
		x := float64(chartLeft + r.from)
		if w < 2 {
			x, w = x-0.5, 2
		}
		cur.Parts = append(cur.Parts, partView{X: f1(x), W: f1(w)})
		cur.N += r.n
		last = r
	}
	flush()
	return out
}

type eventView struct {
	X       string
	Name    string
	Label   string
	LabelY  int
	LineTop int
	Title   string
}

// firstView points out a failed check's first violation: a numbered marker in its
// row (moved aside when two would overlap) and a line down to the moment, on the
// lane it concerns.
type firstView struct {
	ID    string
	X     string // where the marker is drawn
	At    string // where the violation is
	Y     int
	TextY string
	LaneY int // where the line ends
	Num   int
	Label string
	Title string
	atX   float64
	markX float64
}

// chartCheck is a failed check of the scenario, with its marks.
type chartCheck struct {
	Num   int // as the page numbers the failed checks of the spec, from 1
	Name  string
	Kind  conformance.FailureKind
	At    monotime.Time
	Marks []matchers.Mark
	Total int // marks in all, of which Marks are the first
}

// scale maps times to x.
type scale struct {
	x0, x1 monotime.Time
}

func (s scale) x(t monotime.Time) float64 {
	return chartLeft + float64(t-s.x0)/float64(s.x1-s.x0)*chartPlot
}

// col is the pixel column of t, clamped to the plot.
func (s scale) col(t monotime.Time) int {
	c := int(math.Floor(float64(t-s.x0) / float64(s.x1-s.x0) * chartPlot))
	return min(max(c, 0), chartPlot-1)
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

// buildChart draws tr's events from x0 to x1. sc places the scenario's windows;
// checks are its failed checks.
func buildChart(id, kind, title string, tr *conformance.TimelineRecord, sc conformance.ScenarioRecord, checks []chartCheck, x0, x1 monotime.Time) chartView {
	s := scale{x0, x1}
	cv := chartView{ID: id, Kind: kind, Title: title, Width: chartWidth, Left: chartLeft, Right: chartWidth - chartRight,
		PlotWidth: chartPlot, LabelX: chartLeft - 8}
	// Moments are told relative to the scenario's transition events.
	rel := scenarioWindow(tr, sc)
	trans := rel.Transitions

	lanes := gatherLanes(tr, x0, x1)
	// Lanes keep one order in every chart of the scenario (the whole and its zoom):
	// clients before servers before verdicts, each by when it first reported.
	seen := map[string]monotime.Time{}
	for _, e := range tr.Events {
		if _, ok := seen[e.Probe]; !ok && e.Time >= sc.From {
			seen[e.Probe] = e.Time
		}
	}
	for _, l := range lanes {
		if t, ok := seen[l.key]; ok {
			l.first = t
		}
	}
	sort.SliceStable(lanes, func(i, j int) bool {
		ri, rj := roleOrder(lanes[i].role), roleOrder(lanes[j].role)
		if ri != rj {
			return ri < rj
		}
		if lanes[i].first != lanes[j].first {
			return lanes[i].first < lanes[j].first
		}
		return lanes[i].key < lanes[j].key
	})
	breached := map[string]bool{}
	for _, c := range checks {
		for _, m := range c.Marks {
			breached[markLane(m)] = true
		}
	}
	if len(lanes) > maxLanes {
		// Keep every breached lane, then the others in order up to the limit.
		room := maxLanes
		for _, l := range lanes {
			if breached[l.key] {
				room--
			}
		}
		var kept []*laneData
		for _, l := range lanes {
			if breached[l.key] || room > 0 {
				if !breached[l.key] {
					room--
				}
				kept = append(kept, l)
				continue
			}
			cv.Omitted = append(cv.Omitted, l.key)
		}
		lanes = kept
	}

	// Event labels: staggered rows so that close events (exited, start-sent) do not
	// overlap.
	type labelled struct {
		t     timeline.Transition
		x     float64
		label string
		row   int
	}
	var evs []labelled
	var rowEnd []float64
	for _, t := range trans {
		if t.Time < x0 || t.Time > x1 {
			continue
		}
		label := t.Name
		if t.Detail != "" {
			label += " " + t.Detail
		}
		x := s.x(t.Time)
		width := 6.2 * float64(len(label))
		row := -1
		for r, end := range rowEnd {
			if x > end+6 {
				row = r
				break
			}
		}
		if row < 0 {
			if len(rowEnd) < 5 {
				rowEnd = append(rowEnd, 0)
				row = len(rowEnd) - 1
			} else {
				row = len(rowEnd) - 1
			}
		}
		rowEnd[row] = x + width
		evs = append(evs, labelled{t, x, label, row})
	}
	// Then two rows of window brackets, then the row of first-violation markers.
	bandRow := 8 + len(rowEnd)*labelRow
	firstRow := bandRow + 2*labelRow
	cv.PlotTop = firstRow + 20
	for _, e := range evs {
		labelY := 8 + (e.row+1)*labelRow - 3
		cv.Events = append(cv.Events, eventView{X: f1(e.x), Name: e.t.Name, Label: e.label, LabelY: labelY, LineTop: labelY + 3,
			Title: fmt.Sprintf("%s%s, %s", e.t.Name, paren(e.t.Detail), rel.Relative(e.t.Time))})
	}

	y := cv.PlotTop + laneGap
	laneAt := map[string]*laneView{}
	for _, l := range lanes {
		lv := drawLane(l, s, rel, y)
		cv.Lanes = append(cv.Lanes, lv)
		y += lv.H + laneGap
	}
	for i := range cv.Lanes {
		laneAt[cv.Lanes[i].Name] = &cv.Lanes[i]
	}
	cv.PlotBottom = y
	cv.PlotHeight = cv.PlotBottom - cv.PlotTop
	cv.AxisY = y + 4
	cv.TickY, cv.TickLabelY = cv.AxisY+4, cv.AxisY+15
	cv.AxisTitleX, cv.AxisTitleY = chartLeft+chartPlot/2, cv.AxisY+29
	cv.Height = cv.AxisY + axisHeight

	// Windows.
	band := func(row int, from, to monotime.Time, class, label, title string) {
		if from == 0 || to == 0 || to < x0 || from > x1 {
			return
		}
		a, b := s.x(max(from, x0)), s.x(min(to, x1))
		top := bandRow + row*labelRow
		cv.Bands = append(cv.Bands, bandView{X: f1(a), W: f1(max(b-a, 1)), Class: class, Label: label, LabelX: f1(a + 2),
			LabelY: top + 8, BarY: top + 10, Shade: class == "window", Title: title})
	}
	band(0, sc.SteadyStart, sc.SteadyEnd, "steady", "steady state (preconditions)", "the steady state: traffic before the transition, where the preconditions are proven ("+timeline.Duration(sc.SteadyEnd.Sub(sc.SteadyStart))+")")
	band(1, sc.Start, sc.End, "window", "checked window", "the window the checks judge: "+rel.String())

	// Breaches, on the strip above each lane.
	for _, c := range checks {
		drawBreaches(c, s, rel, laneAt)
	}
	// The first violation of each failed check.
	for _, c := range checks {
		if c.At == 0 || c.At < x0 || c.At > x1 {
			continue
		}
		lane := ""
		if len(c.Marks) > 0 {
			lane = markLane(c.Marks[0])
		}
		fv := firstView{ID: fmt.Sprintf("%s-first-%d", id, c.Num), Y: firstRow + 10, TextY: f1(float64(firstRow) + 13.5), Num: c.Num,
			Label: fmt.Sprintf("%d", c.Num), Title: fmt.Sprintf("first violation of check %d, %s (%s): %s", c.Num, c.Name, c.Kind, rel.Relative(c.At)),
			atX: s.x(c.At), LaneY: cv.PlotBottom}
		if l := laneAt[lane]; l != nil {
			fv.Title += ", on " + l.Name
			fv.LaneY = l.Y + breachStrip
		}
		cv.Firsts = append(cv.Firsts, fv)
	}
	// Markers at nearly the same moment are moved right, in turn, so that each
	// number shows; each line still ends at its own moment.
	sort.SliceStable(cv.Firsts, func(i, j int) bool { return cv.Firsts[i].atX < cv.Firsts[j].atX })
	for i := range cv.Firsts {
		f := &cv.Firsts[i]
		f.markX = f.atX
		if i > 0 {
			f.markX = max(f.atX, cv.Firsts[i-1].markX+19)
		}
		f.X, f.At = f1(f.markX), f1(f.atX)
	}

	// Axis: seconds from the first transition event of the scenario, or into the
	// steady state when the scenario never reached its transition.
	zero, zeroName := x0, "the chart's start"
	switch {
	case len(trans) > 0:
		zero, zeroName = trans[0].Time, trans[0].Name
	case sc.SteadyStart != 0:
		zero, zeroName = sc.SteadyStart, "the steady state's start"
	}
	step := tickStep(x1.Sub(x0))
	unit, div := "s", float64(time.Second)
	if step < 100*time.Millisecond {
		unit, div = "ms", float64(time.Millisecond)
	}
	cv.AxisTitle = fmt.Sprintf("%s from %s", map[string]string{"s": "seconds", "ms": "milliseconds"}[unit], zeroName)
	first := zero.Add(time.Duration(math.Ceil(float64(x0-zero)/float64(step))) * step)
	for t := first; t <= x1; t = t.Add(step) {
		v := float64(t-zero) / div
		label := trimFloat(v, step, unit)
		cv.Ticks = append(cv.Ticks, tickView{X: f1(s.x(t)), Label: label})
	}
	return cv
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// tickStep picks a round step for about eight ticks over d.
func tickStep(d time.Duration) time.Duration {
	for _, s := range []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
		50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, time.Minute,
	} {
		if d/s <= 10 {
			return s
		}
	}
	return 2 * time.Minute
}

func trimFloat(v float64, step time.Duration, unit string) string {
	prec := 0
	if unit == "s" && step < time.Second {
		prec = 1
	}
	s := strings.TrimSuffix(fmt.Sprintf("%.*f", prec, v), ".0")
	if s == "-0" {
		s = "0"
	}
	return s
}

// span says where a run of columns lies, relative to the transition events.
func (s scale) span(rel timeline.Window, r colRun) string {
	per := float64(s.x1-s.x0) / chartPlot
	a := s.x0 + monotime.Time(float64(r.from)*per)
	b := s.x0 + monotime.Time(float64(r.to+1)*per)
	if r.from == r.to {
		return rel.Relative(a)
	}
	return "from " + rel.Relative(a) + " to " + rel.Relative(b)
}
