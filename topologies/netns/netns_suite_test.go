package netns_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/internal/specbrief"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// roleArg marks a re-execution of this test binary in a helper role; TestMain runs the
// role instead of the tests. Invoked as a CNI plugin, it runs the plugin instead.
const roleArg = "__dpc_netns_role"

func TestMain(m *testing.M) {
	// The runtime runs plugins with no arguments of ours, so a plugin is told by its
	// name (see cniplugin_test.go).
	if isCNIPlugin() {
		annotatePodMain()
		os.Exit(0)
	}
	if len(os.Args) > 2 && os.Args[1] == roleArg {
		os.Exit(runRole(os.Args[2], os.Args[3:]))
	}
	os.Exit(m.Run())
}

func TestNetns(t *testing.T) {
	RegisterFailHandler(Fail)
	specbrief.RunSpecs(t, "netns topology")
}

var _ = BeforeEach(func() { privileged.Ginkgo(Skip, Fail) })

// roleCmd is the argv that re-executes this binary in a role.
func roleCmd(role string, args ...string) (string, []string) {
	return os.Args[0], append([]string{roleArg, role}, args...)
}

func runRole(role string, args []string) int {
	switch role {
	case "echo": // echo ADDR NAME: answer every connection with NAME
		l, err := net.Listen("tcp", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		for {
			c, err := l.Accept()
			if err != nil {
				return 1
			}
			fmt.Fprint(c, args[1])
			c.Close()
		}
	case "dial": // dial ADDR: print what the server says; retry for 5 s
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", args[0], time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				b, err := io.ReadAll(c)
				c.Close()
				if err == nil {
					fmt.Print(string(b))
					return 0
				}
			}
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			time.Sleep(50 * time.Millisecond)
		}
	case "hold": // hold ADDR: accept connections, print "held" for each, keep them open, silent
		l, err := net.Listen("tcp", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		var held []net.Conn // referenced, so that no finalizer closes them
		for {
			c, err := l.Accept()
			if err != nil {
				runtime.KeepAlive(held)
				return 1
			}
			held = append(held, c)
			fmt.Println("held")
		}
	case "watch": // watch ADDR: connect, print "connected", then how the connection ends
		c, err := net.DialTimeout("tcp", args[0], 5*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("connected")
		_, err = c.Read(make([]byte, 1))
		switch {
		case errors.Is(err, io.EOF):
			fmt.Println("fin")
		case errors.Is(err, syscall.ECONNRESET):
			fmt.Println("reset")
		default:
			fmt.Println("error", err)
		}
		return 0
	case "kube": // kube KUBECONFIG: list Nodes with client-go, print their names
		rc, err := clientcmd.BuildConfigFromFlags("", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		rc.Timeout = 5 * time.Second
		nodes, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, n := range nodes.Items {
			fmt.Println(n.Name)
		}
		return 0
	case "up": // up NODES PODS: bring a topology up and hold it until SIGINT or SIGTERM
		nodes, _ := strconv.Atoi(args[0])
		pods, _ := strconv.Atoi(args[1])
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		topo, err := netns.New(ctx, netns.Options{Nodes: nodes, Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
		if err != nil {
			fmt.Println("set-up failed:", err)
			return 3
		}
		for i := 0; i < pods; i++ {
			n := topo.Nodes()[i%nodes]
			if _, err := topo.AddPod(ctx, topologies.PodSpec{Name: fmt.Sprintf("pod-%d", i), Node: n.Name()}); err != nil {
				fmt.Println("add pod failed:", err)
				topo.Close()
				return 3
			}
		}
		fmt.Println("UP", topo.RunID())
		<-ctx.Done()
		if err := topo.Close(); err != nil {
			fmt.Println("close failed:", err)
			return 4
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// lines streams a reader's lines to a channel.
func lines(r io.Reader) <-chan string {
	ch := make(chan string, 100)
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			ch <- s.Text()
		}
		close(ch)
	}()
	return ch
}
