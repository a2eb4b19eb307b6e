package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/dpconform/dpconform/internal/privileged"
)

// Return codes of tc programs (linux/pkt_cls.h).
const (
	tcActShot     = 2
	tcActRedirect = 7
)

// requireBPF skips (or fails, under DPC_REQUIRE_PRIVILEGED=1) a test that
// needs root and a kernel that can run the datapath.
func requireBPF(t testing.TB) {
	t.Helper()
	privileged.Require(t)
	if err := CheckKernel(); err != nil {
		if privileged.Required() {
			t.Fatalf("kernel cannot run the datapath: %v", err)
		}
		t.Skipf("SKIPPED: kernel cannot run the datapath: %v", err)
	}
}

// bpffs mounts a private bpffs for the test and unmounts it afterwards,
// which drops whatever is still pinned in it.
func bpffs(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}

func open(t *testing.T, pinDir string, opts Options) *Datapath {
	t.Helper()
	d, err := Open(pinDir, opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("open: %+v", ve)
		}
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var (
	ip   = netip.MustParseAddr
	ipp  = netip.MustParseAddrPort
	macA = []byte{0x02, 0, 0, 0, 0, 0xa}
	macB = []byte{0x02, 0, 0, 0, 0, 0xb}
)

// packet is an Ethernet + IPv4 + TCP/UDP packet, crafted by hand.
type packet struct {
	Src, Dst netip.AddrPort
	Proto    Proto
	TCPFlags uint8 // TCP only
	Payload  []byte
	// NoUDPChecksum sends UDP with checksum 0 (none).
	NoUDPChecksum bool
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

func tcp(src, dst string, flags uint8) packet {
	return packet{Src: ipp(src), Dst: ipp(dst), Proto: TCP, TCPFlags: flags, Payload: []byte("hello")}
}

func udp(src, dst string) packet {
	return packet{Src: ipp(src), Dst: ipp(dst), Proto: UDP, Payload: []byte("hello, udp")}
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func pseudoSum(src, dst netip.Addr, proto Proto, l4len int) uint32 {
	s, d := src.As4(), dst.As4()
	sum := csumAdd(0, s[:])
	sum = csumAdd(sum, d[:])
	return sum + uint32(proto) + uint32(l4len)
}

// Bytes marshals p with valid checksums.
func (p packet) Bytes() []byte {
	var l4 []byte
	switch p.Proto {
	case TCP:
		l4 = make([]byte, 20+len(p.Payload))
		binary.BigEndian.PutUint16(l4[0:], p.Src.Port())
		binary.BigEndian.PutUint16(l4[2:], p.Dst.Port())
		binary.BigEndian.PutUint32(l4[4:], 1000) // seq
		if p.TCPFlags&tcpACK != 0 {
			binary.BigEndian.PutUint32(l4[8:], 2000)
		}
		l4[12] = 5 << 4
		l4[13] = p.TCPFlags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], p.Payload)
		binary.BigEndian.PutUint16(l4[16:], csumFold(csumAdd(pseudoSum(p.Src.Addr(), p.Dst.Addr(), TCP, len(l4)), l4)))
	case UDP:
		l4 = make([]byte, 8+len(p.Payload))
		binary.BigEndian.PutUint16(l4[0:], p.Src.Port())
		binary.BigEndian.PutUint16(l4[2:], p.Dst.Port())
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], p.Payload)
		if !p.NoUDPChecksum {
			c := csumFold(csumAdd(pseudoSum(p.Src.Addr(), p.Dst.Addr(), UDP, len(l4)), l4))
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(l4[6:], c)
		}
	}
	iph := make([]byte, 20)
	iph[0] = 0x45
	binary.BigEndian.PutUint16(iph[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(iph[4:], 0x1234)
	binary.BigEndian.PutUint16(iph[6:], 0x4000) // DF
	iph[8] = 64
	iph[9] = byte(p.Proto)
	s, d := p.Src.Addr().As4(), p.Dst.Addr().As4()
	copy(iph[12:], s[:])
	copy(iph[16:], d[:])
	binary.BigEndian.PutUint16(iph[10:], csumFold(csumAdd(0, iph)))

	b := append(append([]byte{}, macA...), macB...)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	b = append(b, iph...)
	return append(b, l4...)
}

// parsePacket decodes what Bytes makes and checks every checksum.
func parsePacket(b []byte) (packet, error) {
	var p packet
	if len(b) < 14+20 || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
		return p, fmt.Errorf("not IPv4: % x", b)
	}
	iph := b[14:34]
	if csumFold(csumAdd(0, iph)) != 0 {
		return p, fmt.Errorf("bad IPv4 header checksum %#04x", binary.BigEndian.Uint16(iph[10:]))
	}
	total := int(binary.BigEndian.Uint16(iph[2:]))
	if 14+total > len(b) {
		return p, fmt.Errorf("truncated: total length %d, have %d", total, len(b)-14)
	}
	l4 := b[34 : 14+total]
	src, dst := netip.AddrFrom4([4]byte(iph[12:16])), netip.AddrFrom4([4]byte(iph[16:20]))
	p.Proto = Proto(iph[9])
	p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:]))
	p.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
	switch p.Proto {
	case TCP:
		p.TCPFlags = l4[13]
		p.Payload = l4[20:]
		if c := csumFold(csumAdd(pseudoSum(src, dst, TCP, len(l4)), l4)); c != 0 {
			return p, fmt.Errorf("bad TCP checksum %#04x", binary.BigEndian.Uint16(l4[16:]))
		}
	case UDP:
		p.Payload = l4[8:]
		if binary.BigEndian.Uint16(l4[6:]) == 0 {
			p.NoUDPChecksum = true
		} else if c := csumFold(csumAdd(pseudoSum(src, dst, UDP, len(l4)), l4)); c != 0 {
			return p, fmt.Errorf("bad UDP checksum %#04x", binary.BigEndian.Uint16(l4[6:]))
		}
	default:
		return p, fmt.Errorf("unexpected protocol %d", p.Proto)
	}
	return p, nil
}

func (c *skbCtx) mark() uint32 { return binary.NativeEndian.Uint32(c[skbMarkOff:]) }

// result is what a program did with a packet.
type result struct {
	Ret  uint32
	Mark uint32
	Out  []byte
}

// run runs prog on data with BPF_PROG_RUN, as if on interface 1 (lo), with
// the given skb->mark.
func run(t *testing.T, prog *ebpf.Program, data []byte, mark uint32) result {
	t.Helper()
	var in, out skbCtx
	binary.NativeEndian.PutUint32(in[skbMarkOff:], mark)
	opts := &ebpf.RunOptions{Data: data, DataOut: make([]byte, len(data)+256), Context: in[:], ContextOut: out[:]}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN %s: %v", prog, err)
	}
	return result{Ret: ret, Mark: out.mark(), Out: opts.DataOut}
}

// runPacket runs prog on p and decodes the packet that comes out.
func runPacket(t *testing.T, prog *ebpf.Program, p packet) (result, packet) {
	t.Helper()
	r := run(t, prog, p.Bytes(), 0)
	got, err := parsePacket(r.Out)
	if err != nil {
		t.Fatalf("%s: packet out of %s: %v", p, prog, err)
	}
	return r, got
}

func (p packet) String() string {
	return fmt.Sprintf("%s %s->%s flags=%#x", p.Proto, p.Src, p.Dst, p.TCPFlags)
}
