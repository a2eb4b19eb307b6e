package probe

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

// Kind says what an Event reports.
type Kind string

// The kinds of events. Each line of a probe's stdout is one Event.
const (
	// KindReady: the probe is set up (listening, or about to start its schedule).
	// Role and PID are set.
	KindReady Kind = "ready"
	// KindAttempt (connect): one new TCP connection. Time is when the attempt started,
	// Seq numbers it, Outcome says how it ended, Latency is start to reply (or to the
	// failure), Backend is who answered, Target the address dialled.
	KindAttempt Kind = "attempt"
	// KindHeld (connect, with Hold): the connection of attempt Seq, which started at
	// Time and was answered, was held open until the probe stopped, then sent a
	// second request at End: Outcome ok if it was answered (Latency after End, by
	// Backend), or how the flow failed (reset, timeout, ...). Held connections are
	// checked only when the probe stops, after its last watermark: judge KindHeld
	// events on a window taken once the probe has stopped.
	KindHeld Kind = "held"
	// KindReleased (connect, with Hold): from Time on, the probe holds none of the
	// connections it opens (it was told to release them); those opened before are
	// held and checked when it stops.
	KindReleased Kind = "released"
	// KindOpen (stream): stream Stream was dialled at Time; Outcome ok or the dial's
	// failure, Latency the handshake.
	KindOpen Kind = "open"
	// KindEcho (stream): a summary of the echoes stream Stream received in one report
	// period: Count echoes, the first received at Time and the last at End; Seq is the
	// last sequence number echoed, Gap the largest gap between consecutive echoes that
	// ended in this period (starting at GapAt, possibly in the previous period),
	// Latency the largest send-to-echo time, Backend who answered.
	KindEcho Kind = "echo"
	// KindGap (stream): no echo arrived on stream Stream from Time to End (Gap long).
	// Emitted for every gap longer than the probe's gap threshold, so large gaps are
	// exact and individually visible; smaller ones only show as KindEcho's Gap.
	KindGap Kind = "gap"
	// KindStall (stream): the probe itself did not run: its writer for stream Stream,
	// due to send at Time, woke only at End (Gap late). Emitted when that exceeds the
	// probe's gap threshold. Time a write waited for room in a full send buffer (which
	// a path that drops everything fills) does not count: only the probe's own
	// lateness, the machine not scheduling it, which no dataplane causes.
	KindStall Kind = "stall"
	// KindEnd (stream): stream Stream ended at Time (when the probe noticed); Outcome
	// reset, closed, wrong-reply, timeout or stopped.
	KindEnd Kind = "end"
	// KindSent (udp): datagram Seq was sent at Time to Target (a label); Outcome ok, or
	// the local send error. With NewSocket, Peer is the local address it was sent
	// from: a port the kernel gave an earlier socket names a flow the dataplane may
	// already know.
	KindSent Kind = "sent"
	// KindReply (udp, with Replies): datagram Seq, sent at Time to the destination
	// labelled Target, was answered at End (Latency after it was sent) by the server
	// Backend, from the address Peer. Outcome ok, or wrong-reply when Peer is not the
	// destination's address (a connected client would not have taken it). Answers
	// later than the probe's timeout, and second answers, are not reported.
	KindReply Kind = "reply"
	// KindServerStall (serve): the echo server itself did not run: its heartbeat, due
	// at Time, woke only at End (Gap late), past ServerStallThreshold. Its echoes
	// were as late, on every stream it answers, and no dataplane caused it.
	KindServerStall Kind = "server-stall"
	// KindRecv (serve): the probe received request Seq from the probe named From,
	// which sent it at Time (the sender's stamp, carried in the request) to the
	// destination labelled Target; End is when it arrived, Peer the source address
	// seen, Proto tcp or udp, Backend this server's name.
	KindRecv Kind = "recv"
	// KindReach (reach): the outcome for the target labelled Label, at address Target
	// over Proto. Time is when the try that decided it started (for UDP the answered
	// try, or the last), Count the tries made, Outcome ok with Backend the server that
	// answered, or how it failed (timeout, refused, reset, unreachable, no-reply,
	// wrong-reply, error; skipped when the probe was stopped before trying), Latency
	// that try's start to its reply or failure, Peer the local address it used (when
	// it had one), Seq the target's position in the configuration, from 1.
	KindReach Kind = "reach"
	// KindMark is a watermark: every event about an attempt that started before Time
	// has already been written.
	KindMark Kind = "mark"
	// KindClock answers the "clock" command: Time is the probe host's CLOCK_MONOTONIC
	// when the probe read the command. It is written at once, outside the batches of
	// other events, so that the round trip it closes is short; the suite's Process
	// takes it (ReadClock) and never puts it on a timeline.
	KindClock Kind = "clock"
	// KindError reports a problem of the probe itself (Err), not of the path measured.
	KindError Kind = "error"
	// KindDone is the last event of a probe that stopped cleanly; Count is the number
	// of attempts, datagrams, echoes or targets it made.
	KindDone Kind = "done"
	// KindExit is not written by probes: the suite's Process adds it when the probe
	// process ends. Outcome is ok (clean), killed (by Kill) or crashed, Err says how.
	KindExit Kind = "exit"
)

// Outcome is how an attempt, a stream or a probe process ended.
type Outcome string

// Outcomes. Linux reports a RST in answer to a SYN as ECONNREFUSED and a RST on an
// established connection as ECONNRESET (or EPIPE on a write); the probe keeps the two
// apart as Refused and Reset, and IsResetOrRefused groups them for invariants that
// treat both as "the dataplane answered with a RST".
const (
	OK          Outcome = "ok"          // the expected reply arrived within the timeout
	Refused     Outcome = "refused"     // ECONNREFUSED: RST (or ICMP port unreachable) in answer to the SYN
	Reset       Outcome = "reset"       // ECONNRESET or EPIPE: RST on an established connection
	Timeout     Outcome = "timeout"     // no answer (SYN-ACK or reply) within the timeout
	Unreachable Outcome = "unreachable" // EHOSTUNREACH/ENETUNREACH: ICMP unreachable or no route
	NoReply     Outcome = "no-reply"    // the peer closed (FIN) without replying
	WrongReply  Outcome = "wrong-reply" // a reply that is not the protocol's, or for another request
	Closed      Outcome = "closed"      // stream: the peer closed with a FIN and no RST followed
	Stopped     Outcome = "stopped"     // stream: ended because the probe was stopped (not a failure)
	Skipped     Outcome = "skipped"     // connect: not attempted, too many attempts in flight
	LocalError  Outcome = "error"       // a local error (out of ports or file descriptors, ...)
	Killed      Outcome = "killed"      // exit: the process was killed by the suite
	Crashed     Outcome = "crashed"     // exit: the process ended without a clean stop
)

// Failed reports whether o counts as a failure of the path measured. OK and Stopped
// do not; everything else does (Skipped too: a blind instrument must not pass).
func (o Outcome) Failed() bool { return o != OK && o != Stopped && o != "" }

// IsResetOrRefused reports whether o means the peer (or something on the path)
// answered with a RST.
func (o Outcome) IsResetOrRefused() bool { return o == Reset || o == Refused }

// Event is one line of a probe's output. Times are CLOCK_MONOTONIC nanoseconds; an
// attempt is stamped when it starts. Fields that do not apply are omitted.
type Event struct {
	Time    monotime.Time `json:"t"`
	Kind    Kind          `json:"k"`
	Probe   string        `json:"p,omitempty"` // set by the suite's Process from the probe's name
	Role    Role          `json:"role,omitempty"`
	PID     int           `json:"pid,omitempty"`
	Seq     uint64        `json:"seq,omitempty"`
	Stream  int           `json:"s,omitempty"` // streams count from 1
	Outcome Outcome       `json:"o,omitempty"`
	Latency time.Duration `json:"lat,omitempty"`
	End     monotime.Time `json:"t1,omitempty"`
	Count   int           `json:"n,omitempty"`
	Gap     time.Duration `json:"gap,omitempty"`
	GapAt   monotime.Time `json:"gt,omitempty"`
	Backend string        `json:"b,omitempty"`
	Target  string        `json:"dst,omitempty"`
	Label   string        `json:"label,omitempty"` // reach: the target's label
	Peer    string        `json:"peer,omitempty"`
	From    string        `json:"from,omitempty"`
	Proto   string        `json:"proto,omitempty"`
	Err     string        `json:"err,omitempty"`
}

// Decoder reads a probe's JSON lines.
type Decoder struct {
	sc   *bufio.Scanner
	line int
}

// NewDecoder returns a Decoder reading from r.
func NewDecoder(r io.Reader) *Decoder {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	return &Decoder{sc: sc}
}

// ErrBadLine wraps a line that is not an Event; decoding can go on after it.
var ErrBadLine = errors.New("not a probe event")

// Decode returns the next Event, io.EOF at the end, or an error wrapping ErrBadLine for
// a line that is not an event (decoding may continue after such an error).
func (d *Decoder) Decode() (Event, error) {
	for d.sc.Scan() {
		d.line++
		b := d.sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(b, &e); err != nil || e.Kind == "" {
			if err == nil {
				err = errors.New(`no "k"`)
			}
			return Event{}, fmt.Errorf("line %d %q: %w: %v", d.line, truncate(string(b), 200), ErrBadLine, err)
		}
		return e, nil
	}
	if err := d.sc.Err(); err != nil {
		return Event{}, fmt.Errorf("read probe output: %w", err)
	}
	return Event{}, io.EOF
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
