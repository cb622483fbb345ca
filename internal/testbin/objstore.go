package testbin

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Object-storage providers with a real server the tests start on loopback,
// named as objstore (and gpustore's bucket configuration) names them.
const (
	S3    = "S3"    // versitygw, posix backend
	GCS   = "GCS"   // fake-gcs-server, filesystem backend
	Azure = "AZURE" // Azurite's blob service
)

// ObjectStoreProviders lists every provider that StartObjectStore starts: the
// object-storage tests run once per provider.
var ObjectStoreProviders = []string{S3, GCS, Azure}

// BucketName is the bucket (S3, GCS) or container (Azure) every
// ObjectStore serves.
const BucketName = "gpustore"

// versitygw's root credentials.
const (
	s3Access = "gpustore-test"
	s3Secret = "gpustore-test-secret"
)

// Azurite's single account and its key: the fixed development account every
// Azurite serves (published with Azurite, not a secret).
const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// ObjectStore is a real object-storage server on a loopback port, serving one
// bucket (BucketName) from a directory of the test's: it keeps its objects
// across Stop and Start, so a test can take it away (an outage) and bring it
// back.
type ObjectStore struct {
	Provider string
	// Dir is the server's working directory; S3's objects are files under
	// Dir/data/<bucket>/<object name>.
	Dir string

	t    testing.TB
	bin  string
	args []string
	addr string
	cmd  *exec.Cmd
	log  *os.File
	// tokenURL is GCS's OAuth token endpoint (see gcsCredentials).
	tokenURL string
}

// StartObjectStore starts provider's server (one of ObjectStoreProviders)
// until the test ends. A missing server fails the test under CI=true and
// skips it otherwise (Need).
//
// GCS: the Google client finds an emulator through the STORAGE_EMULATOR_HOST
// environment variable only, so this sets it for the rest of the test (as
// t.Setenv does: such a test cannot run in parallel with others).
func StartObjectStore(t testing.TB, provider string) *ObjectStore {
	t.Helper()
	s := &ObjectStore{Provider: provider, Dir: t.TempDir(), t: t, addr: FreeAddr(t)}
	data := filepath.Join(s.Dir, "data")
	_, port, _ := net.SplitHostPort(s.addr)
	switch provider {
	case S3:
		// The posix backend serves each top-level directory as a bucket.
		s.bin = Need(t, "versitygw")
		mkdirAll(t, filepath.Join(data, BucketName))
		s.args = []string{"--access", s3Access, "--secret", s3Secret, "--port", s.addr, "posix", data}
	case GCS:
		// The filesystem backend serves each top-level directory as a bucket.
		s.bin = Need(t, "fake-gcs-server")
		mkdirAll(t, filepath.Join(data, BucketName))
		s.args = []string{"-scheme", "http", "-host", "127.0.0.1", "-port", port,
			"-external-url", "http://" + s.addr, "-public-host", s.addr,
			"-backend", "filesystem", "-filesystem-root", data, "-log-level", "warn"}
		s.tokenURL = startTokenServer(t)
		t.Setenv("STORAGE_EMULATOR_HOST", s.addr)
		// Were anything to look for Google's metadata server, it would find
		// a closed loopback port rather than send traffic off the machine.
		t.Setenv("GCE_METADATA_HOST", FreeAddr(t))
	case Azure:
		// The container is created by the client (storage_create_container).
		// Telemetry off: Azurite would otherwise report to Microsoft.
		s.bin = Need(t, "azurite-blob")
		mkdirAll(t, data)
		s.args = []string{"--blobHost", "127.0.0.1", "--blobPort", port, "--location", data,
			"--silent", "--loose", "--skipApiVersionCheck", "--disableTelemetry"}
	default:
		t.Fatalf("no object-storage server for provider %q", provider)
	}
	s.Start()
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
			t.Logf("%s (%s) log:\n%.4000s", provider, filepath.Base(s.bin), b)
		}
	})
	return s
}

// Start (re)starts the server on its address and waits until it accepts
// connections.
func (s *ObjectStore) Start() {
	s.t.Helper()
	logf, err := os.OpenFile(filepath.Join(s.Dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	s.log = logf
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Dir = s.Dir
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.bin, err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s not listening on %s after 60s: %v", filepath.Base(s.bin), s.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop takes the server away: gpustore's requests are refused until Start.
// versitygw and fake-gcs-server are killed (SIGKILL: an outage, not a clean
// shutdown). Azurite is stopped with SIGTERM: it keeps its metadata in
// memory and writes it to its folder from time to time and at shutdown, so a
// SIGKILL loses containers and blobs it had acknowledged, which no cloud
// does; to gpustore both are the same outage.
func (s *ObjectStore) Stop() {
	if s.cmd == nil {
		return
	}
	sig := syscall.SIGKILL
	if s.Provider == Azure {
		sig = syscall.SIGTERM
	}
	_ = s.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	_ = s.log.Close()
	s.cmd = nil
}

// Type is the bucket configuration's type for this server.
func (s *ObjectStore) Type() string { return s.Provider }

// Config is the provider's own options (the bucket configuration's config
// section) for this server, with few retries: a test of an outage should not
// wait out a production retry policy.
func (s *ObjectStore) Config() map[string]any {
	switch s.Provider {
	case S3:
		return map[string]any{"bucket": BucketName, "endpoint": s.addr, "access_key": s3Access,
			"secret_key": s3Secret, "insecure": true, "max_retries": 1}
	case GCS:
		return map[string]any{"bucket": BucketName, "service_account": gcsCredentials(s.t, s.tokenURL), "max_retries": 2}
	case Azure:
		return map[string]any{"storage_account": azuriteAccount, "container": BucketName,
			"storage_connection_string": fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=http://%s/%s;",
				azuriteAccount, azuriteKey, s.addr, azuriteAccount),
			"max_retries":     1,
			"pipeline_config": map[string]any{"retry_delay": "100ms", "max_retry_delay": "500ms"},
		}
	}
	return nil
}

// gcsCredentials is a service account key whose token endpoint is tokenURL.
// objstore's GCS client always authenticates (it has no option to turn that
// off for an emulator), and without a key it would look for Google's
// credentials on the machine and the metadata server; fake-gcs-server
// ignores the token it gets.
func gcsCredentials(t testing.TB, tokenURL string) string {
	key := testRSAKey(t)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     "gpustore-test",
		"private_key_id": "1",
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   "gpustore@gpustore-test.iam.gserviceaccount.com",
		"client_id":      "1",
		"token_uri":      tokenURL,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var rsaKey = sync.OnceValues(func() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) })

func testRSAKey(t testing.TB) *rsa.PrivateKey {
	k, err := rsaKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// startTokenServer answers OAuth token requests with a bearer token, in place
// of Google's token endpoint, until the test ends.
func startTokenServer(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"gpustore-test","token_type":"Bearer","expires_in":3600}`))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/token"
}

// FreeAddr returns a loopback address with a port nobody listens on now and
// that no earlier call in this test process returned. The kernel may give a
// just-closed port to the next listen on :0, so two calls in a row could
// return the same port; never handing one out twice rules that out.
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
	t.Fatal("no free loopback port")
	return ""
}

var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

func mkdirAll(t testing.TB, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
