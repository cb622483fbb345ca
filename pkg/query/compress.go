package query

import (
	"net/http"

	"github.com/klauspost/compress/gzhttp"
	"github.com/klauspost/compress/gzip"
)

// answerCompression returns the middleware that compresses the query API's
// answers at one place, the outermost handler: for the encodings the client
// accepts (gzip; zstd when it asks for it), with pooled encoders at the
// fastest level, and only past 1 KiB. The handlers inside never see
// Accept-Encoding: Prometheus' API would otherwise gzip its own answers with
// a new encoder each (a quarter of the CPU of a small dashboard query, with
// the garbage it leaves the collector), and the query frontend's joined
// answers, which it writes itself, would leave uncompressed.
func answerCompression() func(http.Handler) http.Handler {
	wrap, err := gzhttp.NewWrapper(gzhttp.CompressionLevel(gzip.BestSpeed), gzhttp.MinSize(gzhttp.DefaultMinSize))
	if err != nil {
		panic(err) // constant options
	}
	return func(next http.Handler) http.Handler {
		return wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del("Accept-Encoding")
			next.ServeHTTP(w, r)
		}))
	}
}
