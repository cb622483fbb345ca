package auth

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/bcrypt"
)

func loadUsers(t *testing.T, users ...string) *WebConfig {
	t.Helper()
	cfg := "basic_auth_users:\n"
	for _, u := range users {
		h, err := bcrypt.GenerateFromPassword([]byte(u+"-password"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		cfg += "  " + u + ": " + string(h) + "\n"
	}
	file := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := Load(file, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestPasswordChecksRunInParallel: uncached checks of different
// credentials run side by side up to the slots (half the cores), and
// concurrent requests with the same credentials (a Prometheus' shards
// starting at once) share one check. bcrypt is slowed down here by a
// comparison that waits until released, so that what overlaps can be seen;
// TestPasswordFloodKeepsVerifiedUsersVerified (pkg/server) runs the real one.
func TestPasswordChecksRunInParallel(t *testing.T) {
	if got, want := checkSlots(), max(1, runtimeProcs()/2); got != want {
		t.Errorf("checkSlots %d, want %d", got, want)
	}
	w := loadUsers(t, "alice", "bob")
	w.queue = newCheckQueue(2, maxWaitingChecksPerUser, maxWaitingChecks)
	entered := make(chan string, 16)
	release := make(chan struct{})
	w.compare = func(hash, pass []byte) error {
		entered <- string(pass)
		<-release
		return bcrypt.CompareHashAndPassword(hash, pass)
	}
	h := w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(user string) int {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/query", nil)
		req.SetBasicAuth(user, user+"-password")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	var wg sync.WaitGroup
	codes := make(chan int, 8)
	for _, user := range []string{"alice", "alice", "alice", "bob", "bob"} {
		wg.Add(1)
		go func() { defer wg.Done(); codes <- get(user) }()
	}
	seen := map[string]bool{}
	for range 2 {
		select {
		case p := <-entered:
			seen[p] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("only %v reached bcrypt: checks of different users wait for each other", seen)
		}
	}
	if !seen["alice-password"] || !seen["bob-password"] {
		t.Errorf("checks running at once: %v, want alice's and bob's", seen)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("answer %d", c)
		}
	}
	if n := len(entered); n != 0 {
		t.Errorf("%d more bcrypt checks ran: the same credentials at once must share one", n)
	}
	if got := testutil.ToFloat64(w.checks.WithLabelValues("ok")); got != 2 {
		t.Errorf("gpustore_server_password_checks_total{result=ok} %v, want 2", got)
	}
	// Verified: no more checks.
	if get("alice") != http.StatusOK || get("bob") != http.StatusOK || len(entered) != 0 {
		t.Error("verified passwords were checked again")
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// TestWrongPasswordsNeverEvictVerified: thousands of distinct wrong guesses
// (more than the memo holds) leave a verified password verified: it is not
// checked again. The guesses' comparisons are instant here so that the
// test runs the bound in milliseconds; the same flood with real bcrypt is
// TestPasswordFloodKeepsVerifiedUsersVerified (pkg/server).
func TestWrongPasswordsNeverEvictVerified(t *testing.T) {
	w := loadUsers(t, "prometheus")
	var mtx sync.Mutex
	checked := map[string]int{}
	w.compare = func(hash, pass []byte) error {
		mtx.Lock()
		checked[string(pass)]++
		mtx.Unlock()
		if string(pass) == "prometheus-password" {
			return bcrypt.CompareHashAndPassword(hash, pass)
		}
		return bcrypt.ErrMismatchedHashAndPassword
	}
	h := w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(pass string) int {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/write", nil)
		req.SetBasicAuth("prometheus", pass)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := get("prometheus-password"); code != http.StatusOK {
		t.Fatalf("verified password: %d", code)
	}
	for i := range 3 * maxVerified {
		if code := get(fmt.Sprintf("guess-%d", i)); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, code)
		}
	}
	if code := get("prometheus-password"); code != http.StatusOK {
		t.Fatalf("verified password after the guesses: %d", code)
	}
	if n := checked["prometheus-password"]; n != 1 {
		t.Errorf("the verified password was compared %d times, want once", n)
	}
	if n := checked["guess-7"]; n != 1 {
		t.Errorf("a guess was compared %d times", n)
	}
}

// TestUnknownUsersCostWhatKnownOnesCost: an unknown user's password is
// compared against a hash of the users' highest cost, so that neither a
// faster nor a slower refusal tells that the user does not exist (a fixed
// cost 10 refused unknown users ~60 times slower than users of cost 4).
func TestUnknownUsersCostWhatKnownOnesCost(t *testing.T) {
	w := loadUsers(t, "alice")
	if c, err := bcrypt.Cost(w.cur.Load().fakeHash); err != nil || c != bcrypt.MinCost {
		t.Errorf("fake hash cost %d (%v), want the users' %d", c, err, bcrypt.MinCost)
	}
	var compared []byte
	w.compare = func(hash, pass []byte) error { compared = hash; return bcrypt.CompareHashAndPassword(hash, pass) }
	req := httptest.NewRequest(http.MethodGet, "/api/v1/query", nil)
	req.SetBasicAuth("mallory", "alice-password")
	rec := httptest.NewRecorder()
	w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || string(compared) != string(w.cur.Load().fakeHash) {
		t.Errorf("unknown user: %d, compared against %q", rec.Code, compared)
	}
}

// guessRequest is a request with basic auth user:pass and ctx.
func guessRequest(ctx context.Context, user, pass string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil).WithContext(ctx)
	req.SetBasicAuth(user, pass)
	return req
}

// TestPasswordGuessFloodIsBoundedAndFair: wrong passwords sent faster than
// bcrypt checks them wait for a check in a bounded queue; past it they are
// answered 503 with Retry-After at once (not 401: their password was never
// checked, and a legitimate client caught in the flood retries a 503). And a
// known user's first request is not starved by the flood: the checks are
// handed out in turn to the users waiting (guesses at unknown users share
// one turn), so it waits for the checks running and one guess, not for
// every guess queued before it. Before, every guess waited for a slot
// without bound: 400 guesses in 0.1 s filled all 256 fds of a server, a
// known user waited 10 s and a user's first request 21 s.
func TestPasswordGuessFloodIsBoundedAndFair(t *testing.T) {
	w := loadUsers(t, "alice", "bob")
	var mtx sync.Mutex
	var order []string // the passwords compared, in order
	w.compare = func(hash, pass []byte) error {
		time.Sleep(5 * time.Millisecond)
		mtx.Lock()
		order = append(order, string(pass))
		mtx.Unlock()
		return bcrypt.CompareHashAndPassword(hash, pass)
	}
	h := w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	// 400 guesses at once, then 32 clients guessing on as fast as they are
	// answered, until alice is through.
	stop := make(chan struct{})
	var codesMtx sync.Mutex
	byCode := map[int]int{}
	guess := func(name string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, guessRequest(context.Background(), "mallory", name))
		codesMtx.Lock()
		byCode[rec.Code]++
		codesMtx.Unlock()
		if rec.Code == http.StatusServiceUnavailable && rec.Header().Get("Retry-After") == "" {
			t.Error("a guess refused 503 without Retry-After")
		}
	}
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() { guess(fmt.Sprintf("guess-%d", i)) })
	}
	for c := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				guess(fmt.Sprintf("guess-%d-%d", c, i))
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	rec := httptest.NewRecorder()
	aliceDone := make(chan struct{})
	go func() {
		defer close(aliceDone)
		h.ServeHTTP(rec, guessRequest(context.Background(), "alice", "alice-password"))
	}()
	// The guesses compared once alice waits in the queue (or none, should
	// she find a slot free).
	arrived := -1
	for arrived < 0 {
		w.queue.mtx.Lock()
		waiting := len(w.queue.waiting["alice"]) > 0
		w.queue.mtx.Unlock()
		mtx.Lock()
		switch {
		case waiting:
			arrived = len(order)
		case slices.Contains(order, "alice-password"):
			arrived = slices.Index(order, "alice-password")
		}
		mtx.Unlock()
		runtime.Gosched()
	}
	<-aliceDone
	close(stop)
	wg.Wait()
	if rec.Code != http.StatusOK {
		t.Errorf("alice's first request during the flood: %d", rec.Code)
	}
	mtx.Lock()
	before := slices.Index(order, "alice-password") - arrived
	mtx.Unlock()
	t.Logf("guesses answered %v; %d guesses were compared between alice's arrival in the queue and her check", byCode, before)
	if before < 0 || before > checkSlots()+1 {
		t.Errorf("%d guesses were compared between alice's arrival in the queue and her check, want at most the %d running and one", before, checkSlots())
	}
	if byCode[http.StatusServiceUnavailable] == 0 || byCode[http.StatusOK] > 0 || len(byCode) > 2 {
		t.Errorf("guesses answered %v: want 401 for those checked and 503 at once past the queue's bound", byCode)
	}
}

// TestAbandonedPasswordChecksAreDropped: a request whose client left while
// it waited for a password check is dropped from the queue, not checked:
// its bcrypt time is nobody's. Before, every abandoned guess was still
// checked (a flood kept a core busy after its clients had gone).
func TestAbandonedPasswordChecksAreDropped(t *testing.T) {
	w := loadUsers(t, "alice")
	gate := make(chan struct{})
	var mtx sync.Mutex
	var compared []string
	w.compare = func(hash, pass []byte) error {
		if string(pass) == "gate" {
			<-gate
		}
		mtx.Lock()
		compared = append(compared, string(pass))
		mtx.Unlock()
		return bcrypt.CompareHashAndPassword(hash, pass)
	}
	h := w.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var wg sync.WaitGroup
	// Every slot is taken by a check that waits at the gate.
	for range checkSlots() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), guessRequest(context.Background(), "alice", "gate"))
		}()
	}
	time.Sleep(50 * time.Millisecond)
	ctx, leave := context.WithCancel(context.Background())
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), guessRequest(ctx, "mallory", fmt.Sprintf("abandoned-%d", i)))
		}()
	}
	time.Sleep(50 * time.Millisecond) // they wait
	leave()                           // and their clients go
	time.Sleep(50 * time.Millisecond)
	close(gate)
	wg.Wait()
	mtx.Lock()
	defer mtx.Unlock()
	for _, p := range compared {
		if strings.HasPrefix(p, "abandoned") {
			t.Errorf("compared %v: the abandoned guesses were checked", compared)
			break
		}
	}
}
