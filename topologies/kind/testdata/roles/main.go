// Command roles is the kind topology tests' probe binary: static, so it is the one
// program of the pods' image, with the pods' "pause" and the tests' roles.
//
//	roles pause             wait for SIGTERM (a pod's container, the external client)
//	roles echo ADDR NAME    answer every connection with NAME
//	roles dial ADDR         print what the server at ADDR says; retry for 5 s
//	roles hold ADDR         accept connections and keep them open, silent; print
//	                        "accepted" for each
//	roles watch ADDR        connect, print "connected", then how the connection ends
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}

func run(role string, args []string) int {
	switch role {
	case "pause":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		<-sigs
		return 0
	case "echo":
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
	case "dial":
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
	case "hold":
		l, err := net.Listen("tcp", args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		var held []net.Conn
		for {
			c, err := l.Accept()
			if err != nil {
				runtime.KeepAlive(held)
				return 1
			}
			held = append(held, c)
			// Only an accepted connection ends with a FIN when this process dies; one
			// still in the backlog ends with a RST.
			fmt.Println("accepted")
		}
	case "watch":
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
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}
