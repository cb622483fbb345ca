package blockupload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/tenancy"
)

// The block-upload API is Mimir's (its compactor's), so that `mimirtool
// backfill` works unchanged:
//
//	POST /api/v1/upload/block/{block}/start           body: meta.json with a thanos.files list
//	POST /api/v1/upload/block/{block}/files?path=P    body: the file (index, chunks/000001, ...)
//	POST /api/v1/upload/block/{block}/finish          starts the validation (429: too many at once)
//	GET  /api/v1/upload/block/{block}/check           {"result": "uploading|validating|complete|failed", "error": ...}
//
// The tenant is the request's (X-Scope-OrgID), and the identity must be an
// administrator's (allowed "*" in tenants.auth): a block's samples are not
// checked against the tenant's ingest limits, so uploading is not for the
// tenant's own writers.
//
// The files are written where the block will live, <tenant>/<block>/, with
// the meta as sent in uploading-meta.json: a directory without meta.json is
// a partial block that nothing reads (and that the compactor deletes once
// compact.partial_delete_delay old, an upload abandoned). finish checks that
// every listed file is there at its size, then validates in the background:
// the block is downloaded into the work directory and read whole
// (block.VerifyLocal) and judged against the tenant's bucket (Judge), with
// a heartbeat in validation.json (so check answers "validating" while it
// runs, and a validation whose process died is restarted by the next
// finish); on success meta.json is written last, with the gpustore section,
// and the block is complete; on failure validation.json keeps the reason.
const (
	uploadingMetaFilename = "uploading-meta.json"
	validationFilename    = "validation.json"
	heartbeatInterval     = time.Minute
	heartbeatTimeout      = 5 * time.Minute
	maxMetaBytes          = 1 << 20
)

// allowedFile is what a block's files may be named.
var allowedFile = regexp.MustCompile(`^(index|chunks/\d{6})$`)

// uploadMeta is meta.json as mimirtool sends it: the TSDB's meta and the
// Thanos section, whose files list names every file with its size.
type uploadMeta struct {
	tsdb.BlockMeta
	Thanos struct {
		Labels     map[string]string `json:"labels"`
		Downsample struct {
			Resolution int64 `json:"resolution"`
		} `json:"downsample"`
		Source string `json:"source,omitempty"`
		Files  []struct {
			RelPath   string `json:"rel_path"`
			SizeBytes int64  `json:"size_bytes,omitempty"`
		} `json:"files"`
	} `json:"thanos"`
}

// validation is validation.json.
type validation struct {
	LastUpdate int64  // Unix ms of the last heartbeat
	Error      string // why the block was refused
}

// APIConfig configures the block-upload API.
type APIConfig struct {
	// Ranges are the compactor's block ranges (ms, smallest first): a block
	// longer than the largest or crossing its boundary is refused (422), as
	// Mimir refuses it (`tools bucket upload-blocks` cuts such blocks).
	Ranges []int64
	// WorkDir is where blocks are downloaded to be validated.
	WorkDir string
	// MaxValidations is how many blocks are validated at once; finish
	// answers 429 past it (mimirtool waits and asks again).
	MaxValidations int
}

// API serves the block-upload endpoints.
type API struct {
	cfg     APIConfig
	bkt     objstore.Bucket
	tenants tenancy.Config
	logger  *slog.Logger
	now     func() time.Time

	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewAPI returns the API over bkt.
func NewAPI(cfg APIConfig, bkt objstore.Bucket, tenants tenancy.Config, logger *slog.Logger) *API {
	if cfg.MaxValidations <= 0 {
		cfg.MaxValidations = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &API{cfg: cfg, bkt: bkt, tenants: tenants, logger: logger, now: time.Now,
		sem: make(chan struct{}, cfg.MaxValidations), ctx: ctx, cancel: cancel}
}

// Prefix is the API's path prefix.
const Prefix = "/api/v1/upload/block/"

// Register adds the routes to mux.
func (a *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST "+Prefix+"{block}/start", a.handle(a.start))
	mux.HandleFunc("POST "+Prefix+"{block}/files", a.handle(a.file))
	mux.HandleFunc("POST "+Prefix+"{block}/finish", a.handle(a.finish))
	mux.HandleFunc("GET "+Prefix+"{block}/check", a.handle(a.check))
}

// Stop cancels the validations in progress and waits for them: their
// blocks stay "validating" until the heartbeat times out, then a finish
// starts them again.
func (a *API) Stop() {
	a.cancel()
	a.wg.Wait()
}

// httpError is an answer other than 200.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func fail(status int, format string, args ...any) error {
	return &httpError{status, fmt.Sprintf(format, args...)}
}

// request is one call's tenant and block.
type request struct {
	tenant string
	id     ulid.ULID
	dir    string // <tenant>/<block>
}

func (a *API) handle(f func(w http.ResponseWriter, r *http.Request, q request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := a.tenants.Admin(r)
		var q request
		if err == nil {
			q.tenant, err = a.tenants.FromRequest(r)
		}
		var te *tenancy.Error
		if errors.As(err, &te) {
			http.Error(w, te.Error(), te.Status)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if q.id, err = ulid.ParseStrict(r.PathValue("block")); err != nil {
			http.Error(w, "invalid block ID", http.StatusBadRequest)
			return
		}
		q.dir = block.Dir(q.tenant, q.id)
		if err := f(w, r, q); err != nil {
			var he *httpError
			if errors.As(err, &he) {
				http.Error(w, he.msg, he.status)
				return
			}
			a.logger.Error("block upload", "tenant", q.tenant, "block", q.id, "path", r.URL.Path, "err", err)
			http.Error(w, "internal error: "+err.Error(), http.StatusInternalServerError)
		}
	}
}

// state is a block's upload state.
type state int

const (
	notStarted state = iota
	uploading
	validating
	failed
	complete
)

func (a *API) state(ctx context.Context, q request) (state, *uploadMeta, *validation, error) {
	if _, err := block.ExpectMissing(a.bkt).Attributes(ctx, q.dir+"/"+block.MetaFilename); err == nil {
		return complete, nil, nil, nil
	} else if !a.bkt.IsObjNotFoundErr(err) {
		return 0, nil, nil, err
	}
	var m uploadMeta
	ok, err := a.readJSON(ctx, q.dir+"/"+uploadingMetaFilename, &m)
	if err != nil || !ok {
		return notStarted, nil, nil, err
	}
	var v validation
	ok, err = a.readJSON(ctx, q.dir+"/"+validationFilename, &v)
	switch {
	case err != nil:
		return 0, nil, nil, err
	case !ok:
		return uploading, &m, nil, nil
	case v.Error != "":
		return failed, &m, &v, nil
	case a.now().Sub(time.UnixMilli(v.LastUpdate)) < heartbeatTimeout:
		return validating, &m, &v, nil
	}
	return uploading, &m, &v, nil // a validation that stopped beating: finish again
}

func (a *API) readJSON(ctx context.Context, name string, v any) (bool, error) {
	rc, err := block.ExpectMissing(a.bkt).Get(ctx, name)
	if err != nil {
		if a.bkt.IsObjNotFoundErr(err) {
			return false, nil
		}
		return false, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("parse %s: %w", name, err)
	}
	return true, nil
}

func (a *API) writeJSON(ctx context.Context, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return a.bkt.Upload(ctx, name, bytes.NewReader(b))
}

func (a *API) start(w http.ResponseWriter, r *http.Request, q request) error {
	ctx := r.Context()
	st, _, _, err := a.state(ctx, q)
	if err != nil {
		return err
	}
	switch st {
	case complete:
		return fail(http.StatusConflict, "block already exists")
	case validating:
		return fail(http.StatusBadRequest, "block validation in progress")
	case failed:
		return fail(http.StatusBadRequest, "block validation failed")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxMetaBytes))
	if err != nil {
		return fail(http.StatusRequestEntityTooLarge, "the block metadata was too large (maximum size allowed is %d bytes)", maxMetaBytes)
	}
	var m uploadMeta
	if err := json.Unmarshal(body, &m); err != nil {
		return fail(http.StatusBadRequest, "malformed request body")
	}
	if err := a.checkMeta(ctx, q, &m); err != nil {
		return err
	}
	if err := a.writeJSON(ctx, q.dir+"/"+uploadingMetaFilename, &m); err != nil {
		return err
	}
	a.logger.Info("block upload started", "tenant", q.tenant, "block", q.id, "mint", m.MinTime, "maxt", m.MaxTime)
	return nil
}

// checkMeta refuses what cannot become a block of the tenant's.
func (a *API) checkMeta(ctx context.Context, q request, m *uploadMeta) error {
	m.ULID = q.id
	if m.Version != 1 {
		return fail(http.StatusBadRequest, "meta.json version %d: only version 1 is supported", m.Version)
	}
	if m.MinTime < 0 || m.MaxTime <= m.MinTime {
		return fail(http.StatusBadRequest, "invalid minTime/maxTime: minTime=%d, maxTime=%d", m.MinTime, m.MaxTime)
	}
	if m.MaxTime > a.now().Add(time.Hour).UnixMilli() {
		return fail(http.StatusUnprocessableEntity, "block max time (%s) is in the future", time.UnixMilli(m.MaxTime).UTC().Format(time.RFC3339))
	}
	if m.Thanos.Downsample.Resolution != 0 {
		return fail(http.StatusUnprocessableEntity, "downsampled blocks are not accepted (resolution %d): upload raw blocks, gpustore downsamples them", m.Thanos.Downsample.Resolution)
	}
	maxRange := a.cfg.Ranges[len(a.cfg.Ranges)-1]
	if m.MaxTime-m.MinTime > maxRange {
		return fail(http.StatusUnprocessableEntity, "block duration (%s) is larger than the compactor's largest range (%s): cut it, or upload it with gpustore tools bucket upload-blocks, which does",
			time.Duration(m.MaxTime-m.MinTime)*time.Millisecond, time.Duration(maxRange)*time.Millisecond)
	}
	if floorDiv(m.MinTime, maxRange) != floorDiv(m.MaxTime-1, maxRange) {
		return fail(http.StatusUnprocessableEntity, "block time range crosses a boundary of the compactor's largest range (%s): upload it with gpustore tools bucket upload-blocks, which cuts it", time.Duration(maxRange)*time.Millisecond)
	}
	files := 0
	for _, f := range m.Thanos.Files {
		if f.RelPath == block.MetaFilename {
			continue
		}
		if !allowedFile.MatchString(f.RelPath) {
			return fail(http.StatusBadRequest, "invalid file path in meta.json: %q", f.RelPath)
		}
		if f.SizeBytes <= 0 {
			return fail(http.StatusBadRequest, "file %q has no size in meta.json", f.RelPath)
		}
		files++
	}
	if files < 2 {
		return fail(http.StatusBadRequest, "meta.json must list the block's index and chunk files with their sizes (thanos.files)")
	}
	b, err := ReadBucket(ctx, a.bkt, q.tenant, groupLabels(m.Thanos.Labels))
	if err != nil {
		return fail(http.StatusUnprocessableEntity, "%v", err)
	}
	srcs := m.Compaction.Sources
	if len(srcs) == 0 {
		srcs = []ulid.ULID{q.id}
	}
	del := b.Index.DeletionMarkMap()
	for _, o := range b.Index.Blocks {
		if _, gone := del[o.ULID]; !gone && o.GPUStore.Downsample.Resolution == block.ResolutionRaw && containsAll(o.Compaction.Sources, srcs) && o.ULID != q.id {
			return fail(http.StatusConflict, "block already exists: compacted into %s", o.ULID)
		}
	}
	return nil
}

// groupLabels are the labels a block's Thanos section names for its group,
// without Mimir's and Thanos' own (tenant, ingester, shard): nil when none.
func groupLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if !strings.HasPrefix(k, "__") {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (a *API) file(w http.ResponseWriter, r *http.Request, q request) error {
	ctx := r.Context()
	p := r.URL.Query().Get("path")
	switch {
	case p == "":
		return fail(http.StatusBadRequest, "missing or invalid file path")
	case path.Base(p) == block.MetaFilename:
		return fail(http.StatusBadRequest, "%s is not allowed", block.MetaFilename)
	case !allowedFile.MatchString(p):
		return fail(http.StatusBadRequest, "invalid path: %q", p)
	case r.ContentLength == 0:
		return fail(http.StatusBadRequest, "file cannot be empty")
	}
	st, m, _, err := a.state(ctx, q)
	if err != nil {
		return err
	}
	switch st {
	case notStarted:
		return fail(http.StatusNotFound, "block upload not started")
	case complete:
		return fail(http.StatusConflict, "block already exists")
	case validating:
		return fail(http.StatusBadRequest, "block validation in progress")
	case failed:
		return fail(http.StatusBadRequest, "block validation failed")
	}
	var size int64 = -1
	for _, f := range m.Thanos.Files {
		if f.RelPath == p {
			size = f.SizeBytes
		}
	}
	if size < 0 {
		return fail(http.StatusBadRequest, "unexpected file")
	}
	if r.ContentLength >= 0 && r.ContentLength != size {
		return fail(http.StatusBadRequest, "file size doesn't match %s", block.MetaFilename)
	}
	// A chunk segment may take longer than the server's read timeout.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Hour))
	body := &countingReader{r: io.LimitReader(r.Body, size+1)}
	if err := a.bkt.Upload(ctx, q.dir+"/"+p, body); err != nil {
		return err
	}
	if body.n != size {
		_ = a.bkt.Delete(ctx, q.dir+"/"+p)
		return fail(http.StatusBadRequest, "file %s is %d bytes, meta.json says %d", p, body.n, size)
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (a *API) finish(w http.ResponseWriter, r *http.Request, q request) error {
	ctx := r.Context()
	st, m, _, err := a.state(ctx, q)
	if err != nil {
		return err
	}
	switch st {
	case notStarted:
		return fail(http.StatusNotFound, "block upload not started")
	case complete:
		return fail(http.StatusConflict, "block already exists")
	case validating:
		return fail(http.StatusBadRequest, "block validation in progress")
	case failed:
		return fail(http.StatusBadRequest, "block validation failed")
	}
	for _, f := range m.Thanos.Files {
		if f.RelPath == block.MetaFilename {
			continue
		}
		at, err := block.ExpectMissing(a.bkt).Attributes(ctx, q.dir+"/"+f.RelPath)
		if a.bkt.IsObjNotFoundErr(err) {
			return fail(http.StatusBadRequest, "file %s was not uploaded", f.RelPath)
		}
		if err != nil {
			return err
		}
		if at.Size != f.SizeBytes {
			return fail(http.StatusBadRequest, "file %s is %d bytes, meta.json says %d", f.RelPath, at.Size, f.SizeBytes)
		}
	}
	select {
	case a.sem <- struct{}{}:
	default:
		return fail(http.StatusTooManyRequests, "too many block upload validations in progress, limit is %d", a.cfg.MaxValidations)
	}
	if err := a.writeJSON(ctx, q.dir+"/"+validationFilename, validation{LastUpdate: a.now().UnixMilli()}); err != nil {
		<-a.sem
		return err
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() { <-a.sem }()
		a.validate(q, m)
	}()
	return nil
}

// validate checks the uploaded block and completes it, or records why not.
func (a *API) validate(q request, m *uploadMeta) {
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	log := a.logger.With("tenant", q.tenant, "block", q.id)
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		t := time.NewTicker(heartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := a.writeJSON(ctx, q.dir+"/"+validationFilename, validation{LastUpdate: a.now().UnixMilli()}); err != nil && ctx.Err() == nil {
					log.Warn("block upload: validation heartbeat", "err", err)
				}
			}
		}
	}()
	err := a.complete(ctx, q, m)
	cancel()
	<-beat
	if a.ctx.Err() != nil {
		return // shutting down: the heartbeat stops, a later finish validates again
	}
	bg := context.Background()
	if err != nil {
		log.Warn("block upload refused", "err", err)
		if werr := a.writeJSON(bg, q.dir+"/"+validationFilename, validation{LastUpdate: a.now().UnixMilli(), Error: err.Error()}); werr != nil {
			log.Error("block upload: record the refusal", "err", werr)
		}
		return
	}
	for _, f := range []string{validationFilename, uploadingMetaFilename} {
		if err := a.bkt.Delete(bg, q.dir+"/"+f); err != nil && !a.bkt.IsObjNotFoundErr(err) {
			log.Warn("block upload: remove "+f, "err", err)
		}
	}
	log.Info("block upload complete")
}

// complete downloads and verifies the block and writes its meta.json.
func (a *API) complete(ctx context.Context, q request, m *uploadMeta) error {
	if err := os.MkdirAll(a.cfg.WorkDir, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(a.cfg.WorkDir, "upload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	dir := filepath.Join(work, q.id.String())
	staged := &block.Meta{BlockMeta: m.BlockMeta, GPUStore: block.GPUStoreMeta{Tenant: q.tenant}}
	for _, f := range m.Thanos.Files {
		if f.RelPath != block.MetaFilename {
			staged.GPUStore.Files = append(staged.GPUStore.Files, block.File{RelPath: f.RelPath, SizeBytes: f.SizeBytes})
		}
	}
	if err := block.Download(ctx, a.bkt, staged, dir, errors.New("uploaded file unreadable")); err != nil {
		return err
	}
	b, err := ReadBucket(ctx, a.bkt, q.tenant, groupLabels(m.Thanos.Labels))
	if err != nil {
		return err
	}
	p := Judge(ctx, b, Local{Dir: dir, Meta: m.BlockMeta}, a.cfg.Ranges)
	if p.Refused != nil {
		return p.Refused
	}
	if len(p.Pieces) != 1 || p.Pieces[0].ULID != q.id {
		return fmt.Errorf("block %s would be cut into %d blocks", q.id, len(p.Pieces))
	}
	if p.Pieces[0].Skip != "" {
		return fmt.Errorf("block %s: %s", q.id, p.Pieces[0].Skip)
	}
	pc := p.Pieces[0]
	meta := &block.Meta{BlockMeta: m.BlockMeta, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: q.tenant, Labels: maps.Clone(b.Labels), Source: SourceUpload,
	}}
	meta.MinTime, meta.MaxTime = pc.MinTime, pc.MaxTime
	if meta.GPUStore.Labels == nil {
		meta.GPUStore.Labels = map[string]string{}
	}
	if meta.GPUStore.Files, err = block.LocalFiles(dir); err != nil {
		return err
	}
	if err := meta.Validate(); err != nil {
		return err
	}
	// The block's files are in place: meta.json last makes it a block.
	enc, err := json.MarshalIndent(meta, "", "\t")
	if err != nil {
		return err
	}
	return a.bkt.Upload(ctx, q.dir+"/"+block.MetaFilename, bytes.NewReader(enc))
}

func (a *API) check(w http.ResponseWriter, r *http.Request, q request) error {
	st, _, v, err := a.state(r.Context(), q)
	if err != nil {
		return err
	}
	res := struct {
		State string `json:"result"`
		Error string `json:"error,omitempty"`
	}{}
	switch st {
	case notStarted:
		return fail(http.StatusNotFound, "block doesn't exist")
	case uploading:
		res.State = "uploading"
	case validating:
		res.State = "validating"
	case failed:
		res.State, res.Error = "failed", v.Error
	case complete:
		res.State = "complete"
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(res)
}
