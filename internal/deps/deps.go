// Package deps pins the field's libraries while the skeleton grows; removed once real imports exist.
package deps

import (
	_ "github.com/golang/snappy"
	_ "github.com/grafana/dskit/kv/memberlist"
	_ "github.com/grafana/dskit/modules"
	_ "github.com/grafana/dskit/ring"
	_ "github.com/grafana/dskit/runtimeconfig"
	_ "github.com/grafana/dskit/services"
	_ "github.com/grafana/dskit/tenant"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/prometheus/notifier"
	_ "github.com/prometheus/prometheus/prompb"
	_ "github.com/prometheus/prometheus/promql"
	_ "github.com/prometheus/prometheus/rules"
	_ "github.com/prometheus/prometheus/storage/remote"
	_ "github.com/prometheus/prometheus/tsdb"
	_ "github.com/prometheus/prometheus/web/api/v1"
	_ "github.com/thanos-io/objstore"
	_ "github.com/thanos-io/objstore/providers/filesystem"
	_ "github.com/thanos-io/objstore/providers/s3"
	_ "gopkg.in/yaml.v3"
)
