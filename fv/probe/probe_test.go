package probe

import (
	"bytes"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpconform/dpconform/fv/monotime"
)

func TestConfigArgsRoundTrip(t *testing.T) {
	for _, c := range []Config{
		Serve{Name: "pod-a", TCP: []int{80, 8080}, UDP: []int{53}, RecordTCP: true},
		Serve{Name: "pod-a", Address: "10.0.0.1", TCP: []int{80}, Report: 50 * time.Millisecond},
		Connect{Name: "ext", Target: "10.0.0.1:30080", Label: "np", Interval: time.Millisecond, Timeout: 500 * time.Millisecond, MaxInFlight: 9, Count: 3},
		Connect{Name: "ext", Target: "10.0.0.1:30080"},
		Connect{Name: "ext", Target: "10.0.0.1:30080", Hold: true},
		Stream{Name: "st", Target: "[fd00::1]:80", Streams: 8, Interval: 5 * time.Millisecond, GapThreshold: 20 * time.Millisecond},
		UDP{Name: "p", To: []Destination{{"S", "10.0.0.2:5000"}, {"D", "10.0.0.3:5000"}}, NewSocket: true, Count: 10},
		UDP{Name: "p", To: []Destination{{"svc", "10.96.0.10:80"}}, Replies: true, Timeout: 200 * time.Millisecond},
		UDP{Name: "p", To: []Destination{{"svc", "10.96.0.10:80"}}, Replies: true},
	} {
		got, err := parseConfig(c.Role(), c.Args(), io.Discard)
		if err != nil {
			t.Fatalf("%T %v: %v", c, c.Args(), err)
		}
		want := c
		switch c := c.(type) {
		case Serve:
			want = c.withDefaults()
		case Connect:
			want = c.withDefaults()
		case Stream:
			want = c.withDefaults()
		case UDP:
			want = c.withDefaults()
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %v:\n got %#v\nwant %#v", c.Args(), got, want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		Serve{Name: "a"},
		Serve{Name: "two words", TCP: []int{80}},
		Serve{Name: "a", TCP: []int{70000}},
		Connect{Name: "a", Target: "nope"},
		Connect{Target: "1.2.3.4:5"},
		Connect{Name: "a", Target: "1.2.3.4:5", Interval: time.Microsecond},
		Stream{Name: "a"},
		UDP{Name: "a"},
		UDP{Name: "a", To: []Destination{{"S D", "1.2.3.4:5"}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%#v: no validation error", c)
		}
	}
}

func TestWire(t *testing.T) {
	r := request{kind: reqConnect, from: "ext", seq: 42, sent: 123456789, label: "np"}
	line := r.append(nil)
	got, ok := parseRequest(bytes.TrimSuffix(line, []byte("\n")))
	if !ok || got != r {
		t.Fatalf("parseRequest(%q) = %+v, %v", line, got, ok)
	}
	name, seq, ok := parseReply(bytes.TrimSuffix(appendReply(nil, "pod-a", 42), []byte("\n")))
	if !ok || name != "pod-a" || seq != 42 {
		t.Fatalf("parseReply = %q %d %v", name, seq, ok)
	}
	for _, bad := range []string{"", "hello", "DPC1 R pod-a", "DPC1 R pod-a x", "DPC2 R a 1"} {
		if _, _, ok := parseReply([]byte(bad)); ok {
			t.Errorf("parseReply(%q) accepted", bad)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Outcome
	}{
		{syscall.ECONNREFUSED, Refused},
		{syscall.ECONNRESET, Reset},
		{syscall.EPIPE, Reset},
		{os.ErrDeadlineExceeded, Timeout},
		{syscall.ETIMEDOUT, Timeout},
		{syscall.EHOSTUNREACH, Unreachable},
		{syscall.ENETUNREACH, Unreachable},
		{io.EOF, NoReply},
		{syscall.EADDRNOTAVAIL, LocalError},
		{errors.New("odd"), LocalError},
	} {
		if got, why := classify("connect", &os.SyscallError{Syscall: "x", Err: c.err}); got != c.want || !strings.HasPrefix(why, "connect: ") {
			t.Errorf("classify(%v) = %s %q, want %s", c.err, got, why, c.want)
		}
	}
	if !Refused.IsResetOrRefused() || !Reset.IsResetOrRefused() || Timeout.IsResetOrRefused() {
		t.Error("IsResetOrRefused")
	}
	if OK.Failed() || Stopped.Failed() || !Skipped.Failed() || !Timeout.Failed() {
		t.Error("Failed")
	}
}

func TestDecoder(t *testing.T) {
	in := `{"t":5,"k":"attempt","seq":1,"o":"ok","lat":300000,"b":"pod-a"}

garbage
{"t":6,"k":"done","n":1}
`
	d := NewDecoder(strings.NewReader(in))
	e, err := d.Decode()
	if err != nil || e.Kind != KindAttempt || e.Latency != 300*time.Microsecond || e.Backend != "pod-a" || e.Time != monotime.Time(5) {
		t.Fatalf("first = %+v, %v", e, err)
	}
	if _, err := d.Decode(); !errors.Is(err, ErrBadLine) || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("garbage: %v", err)
	}
	if e, err := d.Decode(); err != nil || e.Kind != KindDone || e.Count != 1 {
		t.Fatalf("done = %+v, %v", e, err)
	}
	if _, err := d.Decode(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// TestRunStopsOnStdinEOF runs a serve role in-process on loopback: closing stdin ends
// it cleanly with a done event.
func TestRunStopsOnStdinEOF(t *testing.T) {
	pr, pw := io.Pipe()
	var out bytes.Buffer
	code := make(chan int)
	go func() { code <- run([]string{"serve", "-name", "s", "-udp", "47999"}, pr, &out, io.Discard) }()
	time.Sleep(100 * time.Millisecond)
	pw.Close()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit code %d; output %s", c, out.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not stop on stdin EOF")
	}
	d := NewDecoder(&out)
	var kinds []Kind
	for {
		e, err := d.Decode()
		if err != nil {
			break
		}
		kinds = append(kinds, e.Kind)
	}
	if len(kinds) < 2 || kinds[0] != KindReady || kinds[len(kinds)-1] != KindDone {
		t.Fatalf("events %v", kinds)
	}
}

func TestUsage(t *testing.T) {
	var stderr bytes.Buffer
	if c := run(nil, strings.NewReader(""), io.Discard, &stderr); c != 2 || !strings.Contains(stderr.String(), "usage") {
		t.Fatalf("no args: %d %q", c, stderr.String())
	}
	stderr.Reset()
	if c := run([]string{"fly"}, strings.NewReader(""), io.Discard, &stderr); c != 2 || !strings.Contains(stderr.String(), `unknown role "fly"`) {
		t.Fatalf("bad role: %d %q", c, stderr.String())
	}
}
