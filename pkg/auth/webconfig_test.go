package auth

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
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
	w.slots = make(chan struct{}, 2)
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
