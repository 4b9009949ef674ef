// capn-test-kubelet: the streaming half of the test node's kubelet API (testkit
// src/runner/node/kubelet.rs, node adaptation 6). The node's own server answers the
// kubelet's paths on the kubelet port and passes exec and port-forward requests here,
// over plain HTTP on the loopback, with what only it knows added to the query: `pid`, a
// process of the container (exec runs the command in that process's mount, UTS, IPC and
// network namespaces, root and working directory, with nsenter), and `ip`, the pod's address (port-forward dials it).
// The streams themselves (SPDY, or WebSockets) are the kubelet's own code,
// k8s.io/cri-streaming, so the super cluster's apiserver talks to the real protocol.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

const (
	idleTimeout           = 4 * time.Hour // the kubelet's --streaming-connection-idle-timeout default
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

type executor struct{ pid string }

// ExecInContainer runs cmd in the namespaces of the container's process.
func (e executor) ExecInContainer(ctx context.Context, _ string, _ string, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if tty {
		return fmt.Errorf("the capn test node has no terminals: exec without -t")
	}
	// The container's root and working directory too, as a runtime's exec has them.
	args := append([]string{"--target", e.pid, "--mount", "--uts", "--ipc", "--net", "--root", "--wd", "--"}, cmd...)
	c := exec.CommandContext(ctx, "nsenter", args...)
	c.Stdin, c.Stdout, c.Stderr = in, out, errOut
	err := c.Run()
	if exitErr, ok := err.(*exec.ExitError); ok {
		return utilexec.CodeExitError{Err: exitErr, Code: exitErr.ExitCode()}
	}
	return err
}

type forwarder struct{ ip string }

// PortForward copies between stream and the pod's port.
func (f forwarder) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(f.ip, strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(conn, stream); done <- struct{}{} }()
	go func() { io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	return nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (plain HTTP: the node's server in front holds TLS)")
	flag.Parse()
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// The node reads the bound address from the first line.
	fmt.Println(listener.Addr().String())
	mux := http.NewServeMux()
	mux.HandleFunc("/exec", func(w http.ResponseWriter, r *http.Request) {
		opts, err := remotecommand.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		q := r.URL.Query()
		remotecommand.ServeExec(w, r, executor{pid: q.Get("pid")}, q.Get("pod"), "", q.Get("container"), q["command"], opts, idleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
	})
	mux.HandleFunc("/portForward", func(w http.ResponseWriter, r *http.Request) {
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		q := r.URL.Query()
		portforward.ServePortForward(w, r, forwarder{ip: q.Get("ip")}, q.Get("pod"), "", opts, idleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
	})
	log.Fatal(http.Serve(listener, mux))
}
