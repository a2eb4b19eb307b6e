package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/dpconform/dpconform/fv/clocks"
	"github.com/dpconform/dpconform/fv/monotime"
)

// Starter starts cmd inside some network namespace; the topology's hosts implement it.
// Start must return once the process runs (like exec.Cmd.Start), not wait for it.
type Starter interface {
	Start(cmd *exec.Cmd) error
}

// Local starts commands in the caller's own network namespace.
type Local struct{}

// Start implements Starter.
func (Local) Start(cmd *exec.Cmd) error { return cmd.Start() }

// NetNS starts commands inside the network namespace bound at Path (for example
// /var/run/netns/NAME). The fork happens on a thread locked into that namespace, and
// the child inherits the thread's namespace.
type NetNS struct {
	Path string
}

// Start implements Starter.
func (n NetNS) Start(cmd *exec.Cmd) error {
	h, err := ns.GetNS(n.Path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.Path, err)
	}
	defer h.Close()
	if err := h.Do(func(ns.NetNS) error { return cmd.Start() }); err != nil {
		return fmt.Errorf("start %s in netns %s: %w", cmd.Path, n.Path, err)
	}
	return nil
}

// Program is how to run the probe: an executable and the arguments that come before
// the role (the role and its flags follow).
type Program struct {
	// Path is the executable.
	Path string
	// Args come before the role, e.g. ["probe"] for "dpconform probe <role> ...".
	Args []string
	// Env is added to the environment the suite runs with.
	Env []string
}

// Binary is the project's main binary at path, run as "<path> probe <role> [flags]".
func Binary(path string) Program { return Program{Path: path, Args: []string{"probe"}} }

// Self is the running executable re-executed as a probe. Its main or TestMain must
// call RunIfChild first.
func Self() (Program, error) {
	exe, err := os.Executable()
	if err != nil {
		return Program{}, fmt.Errorf("find the running executable to re-execute as a probe: %w", err)
	}
	return Program{Path: exe, Env: []string{EnvChild + "=1"}}, nil
}

// Command returns the command that runs cfg's role.
func (p Program) Command(cfg Config) *exec.Cmd {
	args := append(append([]string{}, p.Args...), string(cfg.Role()))
	cmd := exec.Command(p.Path, append(args, cfg.Args()...)...)
	cmd.Env = append(os.Environ(), p.Env...)
	return cmd
}

// Options tune Start.
type Options struct {
	// OnEvent receives every event in the order the probe wrote it, from the one
	// goroutine that reads the probe; it must not block (appending to a Timeline is
	// fine). Probe events carry the probe's name in Probe.
	OnEvent func(Event)
	// Stderr, if set, also receives the probe's stderr (e.g. GinkgoWriter).
	Stderr io.Writer
	// ReadyTimeout bounds the wait for the probe's ready event when ctx has no earlier
	// deadline; default 10s.
	ReadyTimeout time.Duration
	// Clock converts the times the probe writes, read on its host's CLOCK_MONOTONIC,
	// to the suite's; nil when the host shares the suite's clock. It is given each
	// time and the name of the probe that stamped it: a server's KindRecv carries the
	// sender's stamp (Time) beside its own (End).
	Clock func(probe string, t monotime.Time) monotime.Time
}

// Process is a running probe.
type Process struct {
	name string
	role Role
	cfg  Config
	cmd  *exec.Cmd
	opts Options

	stdin  io.WriteCloser
	stderr *tailBuffer

	ready chan struct{}
	done  chan struct{} // closed when the process has exited and its output is read

	mu      sync.Mutex
	events  []Event
	lastMrk monotime.Time
	markCh  chan struct{} // closed and replaced at each mark
	sawDone bool
	killed  bool
	badLine error
	exitErr error

	clockMu sync.Mutex         // one clock exchange at a time
	clockCh chan monotime.Time // the host's reading, from the reader
}

// ErrProbe wraps every error of a probe process (failed to start, crashed, did not
// stop), as opposed to errors of the path it measures, which are events.
var ErrProbe = errors.New("probe failed")

// Start starts cfg's probe through s and waits until the probe reports ready (it
// listens, or its schedule is about to start), the process exits, or ctx ends. A probe
// that was ready is returned even if it has exited since (see Done and Err).
func Start(ctx context.Context, s Starter, prog Program, cfg Config, opts Options) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s %s: %w", ErrProbe, cfg.Role(), cfg.ProbeName(), err)
	}
	cmd := prog.Command(cfg)
	p := &Process{
		name: cfg.ProbeName(), role: cfg.Role(), cfg: cfg, cmd: cmd, opts: opts,
		stderr: &tailBuffer{max: 64 * 1024},
		ready:  make(chan struct{}), done: make(chan struct{}), markCh: make(chan struct{}),
		clockCh: make(chan monotime.Time, 1),
	}
	if opts.Stderr != nil {
		cmd.Stderr = io.MultiWriter(p.stderr, opts.Stderr)
	} else {
		cmd.Stderr = p.stderr
	}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("%w: %s: stdin pipe: %w", ErrProbe, p, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: stdout pipe: %w", ErrProbe, p, err)
	}
	if err := s.Start(cmd); err != nil {
		return nil, fmt.Errorf("%w: start %s (%s): %w", ErrProbe, p, cmd.Path, err)
	}
	go p.read(stdout)

	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case <-p.ready:
		return p, nil
	case <-p.done:
		select {
		case <-p.ready:
			// Ready, and already done: a reach probe may finish this fast, and a
			// select between two closed channels picks either.
			return p, nil
		default:
		}
		return nil, fmt.Errorf("%w: %s exited before it was ready: %w", ErrProbe, p, p.Err())
	case <-ctx.Done():
		kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer kcancel()
		_ = p.Kill(kctx)
		return nil, fmt.Errorf("%w: %s not ready: %w; stderr: %s", ErrProbe, p, ctx.Err(), p.stderr.tail())
	}
}

// String names the probe as "role name".
func (p *Process) String() string { return fmt.Sprintf("probe %s %s", p.role, p.name) }

// Name is the probe's name.
func (p *Process) Name() string { return p.name }

// Role is the probe's role.
func (p *Process) Role() Role { return p.role }

// PID is the probe process's id (of whatever the Starter started).
func (p *Process) PID() int { return p.cmd.Process.Pid }

func (p *Process) read(stdout io.Reader) {
	dec := NewDecoder(stdout)
	for {
		e, err := dec.Decode()
		if errors.Is(err, ErrBadLine) {
			// Something in the probe wrote to stdout; keep it visible, keep reading.
			p.mu.Lock()
			if p.badLine == nil {
				p.badLine = err
			}
			p.mu.Unlock()
			p.deliver(Event{Time: monotime.Now(), Kind: KindError, Err: err.Error()})
			continue
		}
		if err != nil {
			break
		}
		if e.Kind == KindClock {
			select {
			case p.clockCh <- e.Time:
			default: // an answer no one waits for any more
			}
			continue
		}
		p.deliver(p.toSuite(e))
	}
	// Stdout is closed: the process is gone or about to be.
	werr := p.cmd.Wait()
	p.mu.Lock()
	exit := Event{Time: monotime.Now(), Kind: KindExit, Outcome: OK}
	switch {
	case p.killed:
		exit.Outcome, exit.Err = Killed, "killed by the suite"
	case werr != nil:
		exit.Outcome = Crashed
		p.exitErr = fmt.Errorf("%s: %w; stderr: %s", p, werr, p.stderr.tail())
		exit.Err = p.exitErr.Error()
	case !p.sawDone:
		exit.Outcome = Crashed
		p.exitErr = fmt.Errorf("%s exited with status 0 without a clean stop; stderr: %s", p, p.stderr.tail())
		exit.Err = p.exitErr.Error()
	}
	if p.killed {
		p.exitErr = fmt.Errorf("%s was killed", p)
	}
	p.mu.Unlock()
	p.deliver(exit)
	close(p.done)
}

// toSuite puts the times of an event the probe wrote on the suite's clock.
func (p *Process) toSuite(e Event) Event {
	conv := p.opts.Clock
	if conv == nil {
		return e
	}
	if e.Kind == KindRecv && e.From != "" {
		e.Time = conv(e.From, e.Time) // the sender's stamp
	} else {
		e.Time = conv(p.name, e.Time)
	}
	e.End = conv(p.name, e.End)
	e.GapAt = conv(p.name, e.GapAt)
	return e
}

func (p *Process) deliver(e Event) {
	e.Probe = p.name
	// The observer gets the event before any waiter is woken by it: a WaitMark that
	// returns finds the mark on the caller's timeline too.
	if p.opts.OnEvent != nil {
		p.opts.OnEvent(e)
	}
	p.mu.Lock()
	p.events = append(p.events, e)
	switch e.Kind {
	case KindReady:
		select {
		case <-p.ready:
		default:
			close(p.ready)
		}
	case KindMark:
		if e.Time > p.lastMrk {
			p.lastMrk = e.Time
		}
		close(p.markCh)
		p.markCh = make(chan struct{})
	case KindDone:
		p.sawDone = true
	}
	p.mu.Unlock()
}

// Events returns a copy of every event received so far.
func (p *Process) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// Done is closed when the probe process has exited and all its output is read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is nil while the probe runs and after a clean stop; otherwise it says how the
// process ended, with the tail of its stderr.
func (p *Process) Err() error {
	select {
	case <-p.done:
	default:
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exitErr != nil {
		return fmt.Errorf("%w: %w", ErrProbe, p.exitErr)
	}
	return nil
}

// Stderr returns the tail of the probe's stderr.
func (p *Process) Stderr() string { return p.stderr.tail() }

// Command sends a control command ("stop", "mark") to the probe.
func (p *Process) Command(cmd string) error {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("%w: send %q to %s: %w", ErrProbe, cmd, p, err)
	}
	return nil
}

// ReadClock makes one clock exchange with the probe: the suite's clock before the
// command went out and after the answer came back, and the probe host's reading in
// between (clocks.Exchanger).
func (p *Process) ReadClock(ctx context.Context) (clocks.Sample, error) {
	p.clockMu.Lock()
	defer p.clockMu.Unlock()
	select { // a late answer to an exchange that gave up
	case <-p.clockCh:
	default:
	}
	sent := monotime.Now()
	if err := p.Command("clock"); err != nil {
		return clocks.Sample{}, err
	}
	select {
	case stamp := <-p.clockCh:
		return clocks.Sample{Sent: sent, Stamp: stamp, Received: monotime.Now()}, nil
	case <-p.done:
		return clocks.Sample{}, fmt.Errorf("%w: %s exited during a clock exchange: %w", ErrProbe, p, p.Err())
	case <-ctx.Done():
		return clocks.Sample{}, fmt.Errorf("%w: %s did not answer a clock exchange: %w", ErrProbe, p, ctx.Err())
	}
}

// Config is the configuration the probe was started with.
func (p *Process) Config() Config { return p.cfg }

// Release tells a connect probe with Hold to hold no connection it opens from now on
// (it reports a KindReleased event); those it holds it checks when it stops. It does
// nothing to any other probe.
func (p *Process) Release() error {
	if c, ok := p.cfg.(Connect); !ok || !c.Hold {
		return nil
	}
	return p.Command("release")
}

// Stop asks the probe to stop, lets attempts in flight finish (a connect probe may
// take its timeout), and waits for it to exit. When ctx ends first it kills the probe.
// It returns nil only for a clean stop.
func (p *Process) Stop(ctx context.Context) error {
	_ = p.Command("stop")
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return p.Err()
	case <-ctx.Done():
		kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Kill(kctx)
		return fmt.Errorf("%w: %s did not stop: %w; stderr: %s", ErrProbe, p, ctx.Err(), p.stderr.tail())
	}
}

// Kill kills the probe process (SIGKILL) and waits until it is reaped.
func (p *Process) Kill(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	// The signal first: closing stdin first would let the probe stop cleanly.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%w: kill %s: %w", ErrProbe, p, err)
	}
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %s not reaped after SIGKILL: %w", ErrProbe, p, ctx.Err())
	}
}

// WaitMark waits until the probe has reported everything it observed before t (a
// watermark at or after t), or has exited.
func (p *Process) WaitMark(ctx context.Context, t monotime.Time) error {
	asked := false
	for {
		p.mu.Lock()
		reached, ch := p.lastMrk >= t, p.markCh
		p.mu.Unlock()
		if reached {
			return nil
		}
		if !asked && monotime.Now() >= t {
			_ = p.Command("mark")
			asked = true
		}
		select {
		case <-ch:
		case <-p.done:
			return p.Err()
		case <-ctx.Done():
			return fmt.Errorf("%w: %s has not reported up to %v: %w", ErrProbe, p, t, ctx.Err())
		}
	}
}

// Usage is the CPU a probe process used.
type Usage struct {
	User, System time.Duration
	MaxRSSKiB    int64
}

// Usage returns the probe process's resource usage once it has exited (from the
// rusage of what the Starter started), and false before.
func (p *Process) Usage() (Usage, bool) {
	select {
	case <-p.done:
	default:
		return Usage{}, false
	}
	st := p.cmd.ProcessState
	if st == nil {
		return Usage{}, false
	}
	u := Usage{User: st.UserTime(), System: st.SystemTime()}
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		u.MaxRSSKiB = ru.Maxrss
	}
	return u, true
}

// tailBuffer keeps the first and the last bytes written to it: a crash explains itself
// at the head of its stderr (Go's "panic:" or "SIGABRT:") and ends with the stacks.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	head  []byte
	b     []byte
	total int
}

const headBytes = 1000

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += len(p)
	if n := headBytes - len(t.head); n > 0 {
		t.head = append(t.head, p[:min(n, len(p))]...)
	}
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	const show = 2 * headBytes
	if t.total == 0 || strings.TrimSpace(string(t.b)) == "" {
		return "(empty)"
	}
	if t.total <= show {
		return strings.TrimSpace(string(t.b))
	}
	last := t.b[len(t.b)-min(len(t.b), headBytes):]
	return fmt.Sprintf("%s\n[... %d bytes ...]\n%s", strings.TrimSpace(string(t.head)), t.total-len(t.head)-len(last), strings.TrimSpace(string(last)))
}
