package ingest

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/relabel"
)

// checkLabels validates a series' label pairs as they came on the wire
// against the tenant's limits, leaving out the label named drop (the HA
// replica label) and labels with empty values. On error it also returns the
// rejection reason.
func checkLabels(pairs []labelPair, lim *limits.Limits, drop string) (string, error) {
	hasName := false
	n := 0
	for _, p := range pairs {
		if len(p.name) == 0 {
			return reasonInvalidLabels, fmt.Errorf("empty label name in series %s", describe(pairs))
		}
		if len(p.value) == 0 || (drop != "" && yoloString(p.name) == drop) {
			// An empty value means the label is absent, as everywhere in Prometheus.
			continue
		}
		if !utf8.Valid(p.name) || !model.UTF8Validation.IsValidLabelName(yoloString(p.name)) {
			return reasonInvalidLabels, fmt.Errorf("invalid label name %q in series %s", p.name, describe(pairs))
		}
		if !utf8.Valid(p.value) {
			return reasonInvalidLabels, fmt.Errorf("label %q has a value that is not valid UTF-8 in series %s", p.name, describe(pairs))
		}
		if len(p.name) > lim.MaxLabelNameLength {
			return reasonLabelNameTooLong, fmt.Errorf("label name %q is longer than %d (limit max_label_name_length) in series %s", p.name, lim.MaxLabelNameLength, describe(pairs))
		}
		if len(p.value) > lim.MaxLabelValueLength {
			return reasonLabelValueTooLong, fmt.Errorf("value of label %q is longer than %d (limit max_label_value_length) in series %s", p.name, lim.MaxLabelValueLength, describe(pairs))
		}
		if bytes.Equal(p.name, nameLabel) {
			hasName = true
		}
		n++
	}
	if !hasName {
		return reasonInvalidLabels, fmt.Errorf("series %s has no metric name (__name__)", describe(pairs))
	}
	if n > lim.MaxLabelNamesPerSeries {
		return reasonTooManyLabels, fmt.Errorf("series %s has %d labels, more than %d (limit max_label_names_per_series)", describe(pairs), n, lim.MaxLabelNamesPerSeries)
	}
	return "", nil
}

// buildLabels validates a series' label pairs (checkLabels) and returns them
// as sorted labels, without the label named drop. It runs only for series
// the cache does not know; on error it also returns the rejection reason.
func buildLabels(b *labels.ScratchBuilder, pairs []labelPair, lim *limits.Limits, drop string) (labels.Labels, string, error) {
	if reason, err := checkLabels(pairs, lim, drop); err != nil {
		return labels.EmptyLabels(), reason, err
	}
	b.Reset()
	for _, p := range pairs {
		if len(p.value) == 0 || (drop != "" && yoloString(p.name) == drop) {
			continue
		}
		b.Add(yoloString(p.name), yoloString(p.value))
	}
	b.Sort()
	ls := b.Labels() // copies: the result no longer points into the request body
	if dup, ok := ls.HasDuplicateLabelNames(); ok {
		return labels.EmptyLabels(), reasonInvalidLabels, fmt.Errorf("duplicate label name %q in series %s", dup, describe(pairs))
	}
	return ls, "", nil
}

// seriesLabels returns the labels a series is stored with: its wire pairs
// built into sorted labels (without the label named drop, the HA replica
// label) and, for a tenant with rules, relabeled. keep false: the rules drop
// the series. Without rules this is buildLabels; with rules the limits and
// the other checks apply to the relabeled labels (rules may be there to fit
// a series into them), the wire pairs are only checked for what relabeling
// cannot repair (empty or duplicate names). On error it also returns the
// rejection reason.
func (ac *appendCtx) seriesLabels(pairs []labelPair, lim *limits.Limits, rules *relabel.Rules, drop string) (ls labels.Labels, keep bool, reason string, err error) {
	if rules.Empty() {
		ls, reason, err = buildLabels(&ac.builder, pairs, lim, drop)
		return ls, err == nil, reason, err
	}
	b := &ac.builder
	b.Reset()
	for _, p := range pairs {
		if len(p.name) == 0 {
			return labels.EmptyLabels(), false, reasonInvalidLabels, fmt.Errorf("empty label name in series %s", describe(pairs))
		}
		if len(p.value) == 0 || (drop != "" && yoloString(p.name) == drop) {
			continue
		}
		b.Add(yoloString(p.name), yoloString(p.value))
	}
	b.Sort()
	in := b.Labels() // copies: nothing below points into the request body
	if dup, ok := in.HasDuplicateLabelNames(); ok {
		return labels.EmptyLabels(), false, reasonInvalidLabels, fmt.Errorf("duplicate label name %q in series %s", dup, describe(pairs))
	}
	if ac.relabel == nil {
		ac.relabel = labels.NewBuilder(in)
	} else {
		ac.relabel.Reset(in)
	}
	if !rules.Process(ac.relabel) {
		return labels.EmptyLabels(), false, "", nil
	}
	ls = ac.relabel.Labels()
	if reason, err := checkLabelSet(ls, lim); err != nil {
		return labels.EmptyLabels(), false, reason, fmt.Errorf("%w (after relabeling series %s)", err, describe(pairs))
	}
	return ls, true, "", nil
}

// checkLabelSet is checkLabels for built labels: those a tenant's relabel
// rules returned.
func checkLabelSet(ls labels.Labels, lim *limits.Limits) (reason string, err error) {
	if ls.Get(model.MetricNameLabel) == "" {
		return reasonInvalidLabels, fmt.Errorf("series %s has no metric name (__name__)", ls)
	}
	if n := ls.Len(); n > lim.MaxLabelNamesPerSeries {
		return reasonTooManyLabels, fmt.Errorf("series %s has %d labels, more than %d (limit max_label_names_per_series)", ls, n, lim.MaxLabelNamesPerSeries)
	}
	err = ls.Validate(func(l labels.Label) error {
		switch {
		case !model.UTF8Validation.IsValidLabelName(l.Name):
			reason = reasonInvalidLabels
			return fmt.Errorf("invalid label name %q in series %s", l.Name, ls)
		case !utf8.ValidString(l.Value):
			reason = reasonInvalidLabels
			return fmt.Errorf("label %q has a value that is not valid UTF-8 in series %s", l.Name, ls)
		case len(l.Name) > lim.MaxLabelNameLength:
			reason = reasonLabelNameTooLong
			return fmt.Errorf("label name %q is longer than %d (limit max_label_name_length) in series %s", l.Name, lim.MaxLabelNameLength, ls)
		case len(l.Value) > lim.MaxLabelValueLength:
			reason = reasonLabelValueTooLong
			return fmt.Errorf("value of label %q is longer than %d (limit max_label_value_length) in series %s", l.Name, lim.MaxLabelValueLength, ls)
		}
		return nil
	})
	return reason, err
}

var nameLabel = []byte(model.MetricNameLabel)

// describe renders wire labels for an error message: {__name__="x", a="b"}.
func describe(pairs []labelPair) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%q", p.name, p.value)
		if b.Len() > 512 {
			b.WriteString(", …")
			break
		}
	}
	b.WriteByte('}')
	return b.String()
}
