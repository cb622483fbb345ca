// Package storage groups what gpustore keeps in object storage, as Mimir
// groups its storage: bucket opens the bucket (S3, GCS, Azure, a local
// folder), shipper uploads each block a tenant's TSDB completes,
// bucketindex keeps the per-tenant index of the bucket's blocks, and
// bucketstore serves queries from those blocks. The block format itself
// is pkg/block; compaction and downsampling in the bucket are pkg/compact.
package storage
