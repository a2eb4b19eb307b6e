package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// EnvChild is set to "1" in the environment of a probe started from a Self Program;
// RunIfChild looks for it.
const EnvChild = "DPC_PROBE_CHILD"

const usage = `usage: probe <role> [flags]

roles:
  serve    -name N -tcp P[,P] -udp P[,P] [-record-tcp]
  connect  -name N -target HOST:PORT [-interval 2ms] [-timeout 1s] [-count N]
  stream   -name N -target HOST:PORT [-streams K] [-interval 5ms]
  udp      -name N -to LABEL=IP:PORT [-to ...] [-interval 1ms] [-new-socket | -replies [-timeout 1s]]
  reach    -name N -target PROTO,IP:PORT,LABEL [-target ...] [-timeout 500ms] [-tries 3]
  clock    -name N

The probe writes one JSON event per line on stdout and reads commands on stdin:
"stop" (or closing stdin, or SIGTERM) stops it cleanly, "mark" asks for a watermark,
"clock" for a reading of CLOCK_MONOTONIC, written at once. A reach probe exits by
itself once it has reported every target.
"probe <role> -h" lists a role's flags.
`

// RunIfChild runs the probe and exits when this process was started as a probe from a
// Self Program; otherwise it returns at once. Call it first in TestMain (or main) of
// every binary that re-executes itself as a probe.
func RunIfChild() {
	if os.Getenv(EnvChild) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
}

// Main runs the probe role args[0] with the flags args[1:], writing events to stdout,
// and returns the exit code: 0 after a clean stop, 1 on an error of the probe, 2 on
// bad usage. The main binary calls it for "dpconform probe <role> [flags]":
//
//	os.Exit(probe.Main(os.Args[2:]))
func Main(args []string) int {
	return run(args, os.Stdin, os.Stdout, os.Stderr)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "help" || args[0] == "--help" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cfg, err := parseConfig(Role(args[0]), args[1:], stderr)
	if err != nil {
		fmt.Fprintf(stderr, "probe: %v\n\n%s", err, usage)
		return 2
	}
	em := newEmitter(stdout)
	r, err := newRunner(cfg, em)
	if err != nil {
		em.emit(Event{Time: monotime.Now(), Kind: KindError, Err: err.Error()})
		em.close()
		fmt.Fprintf(stderr, "probe %s: %v\n", cfg.Role(), err)
		return 1
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	go func() {
		select {
		case <-sig:
			stop()
		case <-ctx.Done():
		}
	}()
	go control(ctx, stdin, stop, r, em)
	go func() {
		t := time.NewTicker(reportPeriod(cfg))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				em.emit(Event{Time: r.mark(), Kind: KindMark})
			}
		}
	}()

	count, err := r.run(ctx)
	if err != nil {
		em.emit(Event{Time: monotime.Now(), Kind: KindError, Err: err.Error()})
		em.close()
		fmt.Fprintf(stderr, "probe %s %s: %v\n", cfg.Role(), cfg.ProbeName(), err)
		return 1
	}
	em.emit(Event{Time: monotime.Now(), Kind: KindDone, Count: count})
	em.close()
	return 0
}

func reportPeriod(cfg Config) time.Duration {
	switch c := cfg.(type) {
	case Serve:
		return c.Report
	case Connect:
		return c.Report
	case Stream:
		return c.Report
	case UDP:
		return c.Report
	}
	return DefaultReport
}

// control reads commands from stdin; the end of stdin stops the probe, which is also
// how a probe ends when the suite that started it dies.
func control(ctx context.Context, stdin io.Reader, stop func(), r runner, em *emitter) {
	defer stop()
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		switch cmd := strings.TrimSpace(sc.Text()); cmd {
		case "stop":
			return
		case "mark":
			em.emit(Event{Time: r.mark(), Kind: KindMark})
		case "clock":
			em.now(Event{Time: monotime.Now(), Kind: KindClock})
		case "release":
			if rel, ok := r.(releaser); ok {
				rel.release()
			} else {
				em.emit(Event{Time: monotime.Now(), Kind: KindError, Err: "release: this probe holds no connections"})
			}
		case "":
		default:
			em.emit(Event{Time: monotime.Now(), Kind: KindError, Err: fmt.Sprintf("unknown command %q (stop, mark, clock, release)", cmd)})
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// releaser is a runner that holds connections until it is told to stop holding new
// ones (a connect probe with Hold).
type releaser interface{ release() }

// runner is one role at work.
type runner interface {
	// run works until ctx is cancelled (a reach probe: until it has tried every
	// target), lets what is in flight finish, and returns the number of attempts,
	// datagrams, echoes or targets made.
	run(ctx context.Context) (int, error)
	// mark returns the current watermark.
	mark() monotime.Time
}

func newRunner(cfg Config, em *emitter) (runner, error) {
	switch c := cfg.(type) {
	case Serve:
		return newServer(c, em), nil
	case Connect:
		return newConnector(c, em), nil
	case Stream:
		return newStreamer(c, em), nil
	case UDP:
		return newUDPSender(c, em)
	case Reach:
		return newReacher(c, em), nil
	case Clock:
		return idle{cfg: c, em: em}, nil
	}
	return nil, fmt.Errorf("no runner for %T", cfg)
}

// idle is RoleClock's runner: ready at once, then nothing until it is stopped, and
// nothing in flight.
type idle struct {
	cfg Clock
	em  *emitter
}

func (r idle) run(ctx context.Context) (int, error) {
	r.em.emit(Event{Time: monotime.Now(), Kind: KindReady, Role: RoleClock, Probe: r.cfg.Name, PID: os.Getpid()})
	<-ctx.Done()
	return 0, nil
}

func (idle) mark() monotime.Time { return monotime.Now() }

// emitter writes events to stdout from one goroutine. Producers never block on the
// pipe: a slow reader must not stall the schedule being measured, so the queue is
// unbounded and written in batches, at most one every flushEvery.
type emitter struct {
	mu      sync.Mutex
	writeMu sync.Mutex // held while writing to w: by the loop's batches and by now
	queue   []Event
	closed  bool
	wake    chan struct{}
	closing chan struct{}
	done    chan struct{}
	w       *bufio.Writer
}

// flushEvery is the shortest time between two writes of events. Every event carries
// its own time, so it delays only what the suite waits for (a mark, a step's "until
// it answers"), by at most this; in return a probe at a 2 ms schedule writes 50 times
// a second rather than 500. Through the cluster topology each write is a frame that
// the API server and the kubelet relay from the probe's pod, on the machine whose
// schedule the probes measure.
const flushEvery = 20 * time.Millisecond

func newEmitter(w io.Writer) *emitter {
	e := &emitter{wake: make(chan struct{}, 1), closing: make(chan struct{}), done: make(chan struct{}), w: bufio.NewWriterSize(w, 64*1024)}
	go e.loop()
	return e
}

func (e *emitter) emit(ev Event) {
	e.mu.Lock()
	if !e.closed {
		e.queue = append(e.queue, ev)
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *emitter) loop() {
	defer close(e.done)
	enc := json.NewEncoder(e.w)
	var batch []Event
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		<-e.wake
		// Let the batch fill until flushEvery after the last write; close ends the
		// wait, so that the last events go out at once.
		select {
		case <-pause.C:
		case <-e.closing:
		}
		e.mu.Lock()
		batch, e.queue = e.queue, batch[:0]
		closed := e.closed
		e.mu.Unlock()
		e.writeMu.Lock()
		for i := range batch {
			// An encoding error cannot happen for Event; a write error means the
			// suite is gone, and the probe then stops on the end of stdin.
			_ = enc.Encode(&batch[i])
		}
		_ = e.w.Flush()
		e.writeMu.Unlock()
		if closed {
			return
		}
		pause.Reset(flushEvery)
	}
}

// now writes ev at once, ahead of the queued batch (whose events are older): for an
// answer whose delay is itself measured, a clock reading. After close it does nothing.
func (e *emitter) now(ev Event) {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return
	}
	b, _ := json.Marshal(&ev)
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.w.Flush()
}

// close writes what is queued and stops the emitter.
func (e *emitter) close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return
	}
	e.closed = true
	e.mu.Unlock()
	close(e.closing)
	select {
	case e.wake <- struct{}{}:
	default:
	}
	<-e.done
}
