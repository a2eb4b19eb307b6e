package probe

import (
	"bytes"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/dpconform/dpconform/fv/monotime"
)

// The line protocol between probe clients and the serve role. One request is one
// line (TCP) or one datagram (UDP):
//
//	DPC1 <C|S|U> <from> <seq> <sent-ns> <label>\n
//
// C is a connect attempt (the server replies, then closes first, so that TIME_WAIT
// stays on the server and the client's ports are free again at once), S a stream
// message, U a one-way datagram. The server answers each with
//
//	DPC1 R <server-name> <seq>\n
//
// Any other line is answered with "<server-name>\n", which makes the identity easy to
// read with nc.
//
// A label is percent-escaped on the wire (space, control bytes and '%'; a label "-"
// as "%2D"), so that one can name a cell of a matrix, "y/b TCP/80", and still be one
// field; an empty label is "-".
const wireMagic = "DPC1"

const (
	reqConnect = 'C'
	reqStream  = 'S'
	reqUDP     = 'U'
)

type request struct {
	kind  byte
	from  string
	seq   uint64
	sent  monotime.Time
	label string
}

func (r request) append(b []byte) []byte {
	b = append(b, wireMagic...)
	b = append(b, ' ', r.kind, ' ')
	b = append(b, r.from...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.seq, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(r.sent), 10)
	b = append(b, ' ')
	b = appendLabel(b, r.label)
	return append(b, '\n')
}

func appendLabel(b []byte, label string) []byte {
	const hex = "0123456789ABCDEF"
	switch label {
	case "":
		return append(b, '-')
	case "-":
		return append(b, "%2D"...)
	}
	for i := 0; i < len(label); i++ {
		if c := label[i]; c <= ' ' || c == '%' || c == 0x7f {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return b
}

func parseLabel(field string) (string, bool) {
	if field == "-" {
		return "", true
	}
	if strings.IndexByte(field, '%') < 0 {
		return field, true
	}
	s, err := url.PathUnescape(field)
	return s, err == nil
}

func parseRequest(line []byte) (request, bool) {
	f := bytes.Fields(line)
	if len(f) != 6 || string(f[0]) != wireMagic || len(f[1]) != 1 {
		return request{}, false
	}
	seq, err1 := strconv.ParseUint(string(f[3]), 10, 64)
	sent, err2 := strconv.ParseInt(string(f[4]), 10, 64)
	label, ok := parseLabel(string(f[5]))
	if err1 != nil || err2 != nil || !ok {
		return request{}, false
	}
	return request{kind: f[1][0], from: string(f[2]), seq: seq, sent: monotime.Time(sent), label: label}, true
}

func appendReply(b []byte, name string, seq uint64) []byte {
	b = append(b, wireMagic...)
	b = append(b, " R "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, seq, 10)
	return append(b, '\n')
}

// parseReply returns the server's name and the sequence number it echoes.
func parseReply(line []byte) (name string, seq uint64, ok bool) {
	f := bytes.Fields(line)
	if len(f) != 4 || string(f[0]) != wireMagic || string(f[1]) != "R" {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(string(f[3]), 10, 64)
	if err != nil {
		return "", 0, false
	}
	return string(f[2]), seq, true
}

// checkToken validates a name or label that travels in the line protocol.
func checkToken(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s must not be empty", what)
	}
	if strings.ContainsAny(s, " \t\r\n") || s == "-" {
		return fmt.Errorf("%s %q must be one word and not %q", what, s, "-")
	}
	return nil
}
