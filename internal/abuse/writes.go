// The write side's workloads: slow and trickled bodies that hold write
// slots, a flood of new tenants, a flood of wrong passwords, and metadata
// without end.

package abuse

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// SlowBodies opens n connections to addr that each send the headers of a
// remote write (hdr added, Content-Length 1 MiB) and one byte of its body,
// then stall. It returns once every connection has sent its byte; close
// closes them. tlsConfig nil: plain TCP.
func SlowBodies(addr string, tlsConfig *tls.Config, n int, hdr http.Header) (closeAll func(), err error) {
	conns := make([]net.Conn, 0, n)
	closeAll = func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	var head strings.Builder
	head.WriteString("POST /api/v1/write HTTP/1.1\r\nHost: gpustore\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\nContent-Length: 1048576\r\n")
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n\x00") // the headers and the body's first byte
	for range n {
		var c net.Conn
		if tlsConfig != nil {
			c, err = tls.Dial("tcp", addr, tlsConfig)
		} else {
			c, err = net.Dial("tcp", addr)
		}
		if err != nil {
			closeAll()
			return nil, err
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte(head.String())); err != nil {
			closeAll()
			return nil, err
		}
	}
	return closeAll, nil
}

// TrickledBodies opens n connections to addr that each send the headers of
// a write to path (a remote write, or an OTLP export with
// hdr's Content-Type; Content-Length 1 MiB, hdr added) and then one byte of
// the body every interval, each under a stall timeout, until close is
// called or the server cuts it. cut counts the connections the server has
// closed or answered so far. tlsConfig nil: plain TCP.
func TrickledBodies(addr string, tlsConfig *tls.Config, path string, n int, hdr http.Header, interval time.Duration) (cut func() int, closeAll func(), err error) {
	var head strings.Builder
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: gpustore\r\nContent-Length: 1048576\r\n", path)
	if hdr.Get("Content-Type") == "" {
		head.WriteString("Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\n")
	}
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	var mtx sync.Mutex
	var conns []net.Conn
	var ended int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	closeAll = func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		mtx.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mtx.Unlock()
		wg.Wait()
	}
	for range n {
		var c net.Conn
		if tlsConfig != nil {
			c, err = tls.Dial("tcp", addr, tlsConfig)
		} else {
			c, err = net.Dial("tcp", addr)
		}
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		mtx.Lock()
		conns = append(conns, c)
		mtx.Unlock()
		if _, err := c.Write([]byte(head.String())); err != nil {
			closeAll()
			return nil, nil, err
		}
		wg.Add(2)
		go func() { // a byte every interval
			defer wg.Done()
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				if _, err := c.Write([]byte{0}); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()
		go func() { // the server's answer or close ends it
			defer wg.Done()
			_, _ = c.Read(make([]byte, 1))
			mtx.Lock()
			ended++
			mtx.Unlock()
		}()
	}
	cut = func() int {
		mtx.Lock()
		defer mtx.Unlock()
		return ended
	}
	return cut, closeAll, nil
}

// Answers counts HTTP answers by status code; 0 counts transport errors.
type Answers struct {
	mtx    sync.Mutex
	ByCode map[int]int
}

func (a *Answers) add(code int) {
	a.mtx.Lock()
	defer a.mtx.Unlock()
	if a.ByCode == nil {
		a.ByCode = map[int]int{}
	}
	a.ByCode[code]++
}

// Count is how many answers had code.
func (a *Answers) Count(code int) int {
	a.mtx.Lock()
	defer a.mtx.Unlock()
	return a.ByCode[code]
}

// do sends req and records its status (0 for a transport error).
func (a *Answers) do(client *http.Client, req *http.Request) {
	resp, err := client.Do(req)
	if err != nil {
		a.add(0)
		return
	}
	_ = resp.Body.Close()
	a.add(resp.StatusCode)
}

// TenantFlood sends one remote write of body (a snappy-compressed 1.0
// request) to url for each of n new tenants named prefix0, prefix1, …, with
// conc requests at a time; setup may add credentials.
func TenantFlood(ctx context.Context, client *http.Client, url string, body []byte, prefix string, n, conc int, setup func(*http.Request)) *Answers {
	var a Answers
	ids := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
				if err != nil {
					a.add(0)
					continue
				}
				req.Header.Set("Content-Type", "application/x-protobuf")
				req.Header.Set("Content-Encoding", "snappy")
				req.Header.Set("X-Scope-OrgID", fmt.Sprintf("%s%d", prefix, i))
				if setup != nil {
					setup(req)
				}
				a.do(client, req)
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		ids <- i
	}
	close(ids)
	wg.Wait()
	return &a
}

// PasswordFlood sends requests to url with basic-auth user and a different
// wrong password each time from conns goroutines until ctx ends, then
// returns their answers.
func PasswordFlood(ctx context.Context, client *http.Client, url, user string, conns int) *Answers {
	var a Answers
	var wg sync.WaitGroup
	for g := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					a.add(0)
					return
				}
				req.SetBasicAuth(user, fmt.Sprintf("guess-%d-%d", g, i))
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						a.add(0)
					}
					continue
				}
				_ = resp.Body.Close()
				a.add(resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	return &a
}
