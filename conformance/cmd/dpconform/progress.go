package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/dpconform/dpconform/conformance"
)

// ProgressMode is how a ProgressPrinter shows a run.
type ProgressMode int

const (
	// ProgressLive redraws one status line in place (which spec of how many, its
	// phase, the time it has taken) and prints a line per result: for a terminal.
	ProgressLive ProgressMode = iota
	// ProgressLines prints a line per phase and per result: for a log read later.
	ProgressLines
	// ProgressQuiet prints a line per result, and a failure's details: for CI logs.
	ProgressQuiet
)

// ProgressPrinter prints a run's progress for people (Config.Progress = p.Update).
// Colours are for terminals only: the caller says whether to use them.
type ProgressPrinter struct {
	// Width, if set, is the terminal's width: the live line is cut to fit it, since
	// a line that wraps cannot be redrawn in place.
	Width int

	out   io.Writer
	mode  ProgressMode
	color bool
	start time.Time
	now   func() time.Time

	mu      sync.Mutex
	cur     *conformance.Progress // the run in progress, for the live line
	drawn   bool                  // the live line is on the screen
	stop    chan struct{}
	stopped sync.WaitGroup
}

// NewProgressPrinter prints to out in mode, with ANSI colours if color.
func NewProgressPrinter(out io.Writer, mode ProgressMode, color bool) *ProgressPrinter {
	p := &ProgressPrinter{out: out, mode: mode, color: color, start: time.Now(), now: time.Now, stop: make(chan struct{})}
	if mode == ProgressLive {
		p.stopped.Add(1)
		go p.tick()
	}
	return p
}

// tick redraws the live line, so that its times move while a phase lasts.
func (p *ProgressPrinter) tick() {
	defer p.stopped.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.redraw()
			p.mu.Unlock()
		}
	}
}

// Close stops redrawing and clears the live line.
func (p *ProgressPrinter) Close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	p.stopped.Wait()
	p.mu.Lock()
	p.clear()
	p.cur = nil
	p.mu.Unlock()
}

// Update is a Config.Progress.
func (p *ProgressPrinter) Update(ev conformance.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ev.Result == nil {
		c := ev
		p.cur = &c
		switch p.mode {
		case ProgressLive:
			p.redraw()
		case ProgressLines:
			p.println(p.status(ev))
		}
		return
	}
	if !ev.Final {
		// One run of a repeated spec.
		if p.mode != ProgressQuiet || ev.Result.Result != conformance.Passed {
			p.println(fmt.Sprintf("%s  run %d of %d: %s", p.place(ev), ev.Run, ev.Runs, p.verdict(*ev.Result)))
		}
		return
	}
	p.cur = nil
	p.println(p.resultLine(ev))
	if r := ev.Result; (r.Result == conformance.Failed || r.Result == conformance.Errored) && r.Message != "" {
		p.println(indent(r.Message, "    "))
	}
}

// Logf prints a log line without tearing the live line.
func (p *ProgressPrinter) Logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.println(fmt.Sprintf(format, args...))
}

// place is "[3/24] RESTART-NODEPORT-NEW".
func (p *ProgressPrinter) place(ev conformance.Progress) string {
	n := fmt.Sprint(ev.Index)
	if ev.Total > 0 {
		n += "/" + fmt.Sprint(ev.Total)
	}
	return fmt.Sprintf("[%s] %s", n, ev.ID)
}

// status is a run's line while it runs: "[3/24] RESTART-NODEPORT-NEW  run 2/3 ·
// transition · 12.4 s (all: 2m31s)".
func (p *ProgressPrinter) status(ev conformance.Progress) string {
	s := p.place(ev)
	if ev.Runs > 1 {
		s += fmt.Sprintf("  run %d/%d", ev.Run, ev.Runs)
	}
	return fmt.Sprintf("%s · %s · %s (all: %s)", s, p.paint(bold, string(ev.Phase)), seconds(p.now().Sub(ev.Started)), p.now().Sub(p.start).Round(time.Second))
}

func (p *ProgressPrinter) resultLine(ev conformance.Progress) string {
	r := *ev.Result
	s := p.place(ev) + " " + p.verdict(r)
	if k, n := r.Passes(); len(r.Runs) > 0 {
		s += fmt.Sprintf(", %d of %d runs passed", k, n)
	}
	s += " in " + seconds(r.Duration)
	switch {
	case r.Result == conformance.Passed:
		if f := r.Report().KeyFigures(); f != "" {
			s += ": " + f
		}
	case r.Reason != "":
		s += ": " + r.Reason
	}
	return s
}

func (p *ProgressPrinter) verdict(r conformance.Result) string {
	switch r.Result {
	case conformance.Passed:
		return p.paint(green, "✓ passed")
	case conformance.Failed:
		v := "✗ FAILED"
		if k := r.FailedKindsText(); k != "" {
			v += " (" + k + ")"
		}
		return p.paint(red, v)
	case conformance.Errored:
		return p.paint(magenta, "! ERROR (not a verdict on the implementation)")
	}
	return p.paint(yellow, "- "+string(r.Result))
}

const (
	bold    = "1"
	red     = "1;31"
	green   = "32"
	yellow  = "33"
	magenta = "1;35"
)

func (p *ProgressPrinter) paint(code, s string) string {
	if !p.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

// println prints a line above the live line. p.mu is held.
func (p *ProgressPrinter) println(s string) {
	p.clear()
	fmt.Fprintln(p.out, s)
	p.redraw()
}

// clear erases the live line. p.mu is held.
func (p *ProgressPrinter) clear() {
	if p.drawn {
		fmt.Fprint(p.out, "\r\x1b[K")
		p.drawn = false
	}
}

// redraw draws the live line of the run in progress. p.mu is held.
func (p *ProgressPrinter) redraw() {
	if p.mode != ProgressLive || p.cur == nil {
		return
	}
	line := p.status(*p.cur)
	if p.Width > 0 {
		color := p.color
		p.color = false
		if l := []rune(p.status(*p.cur)); len(l) >= p.Width {
			line = string(l[:p.Width-2]) + "…"
		}
		p.color = color
	}
	fmt.Fprint(p.out, "\r\x1b[K"+line)
	p.drawn = true
}

// failedKinds are the kinds a spec failed with, for people: "reset, gap".

func seconds(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func indent(s, pre string) string {
	return pre + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+pre)
}
