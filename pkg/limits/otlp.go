package limits

import (
	"fmt"

	"github.com/prometheus/otlptranslator"
	"github.com/prometheus/prometheus/config"
	"gopkg.in/yaml.v3"
)

// OTLP is how a tenant's OTLP metrics are translated to Prometheus series
// (pkg/ingest's OTLP endpoint). The fields and their YAML names are
// Prometheus' own `otlp:` configuration block, so a Prometheus user's block
// can be pasted into a tenant's overrides; the last two are what Prometheus
// sets by feature flag or not at all:
//
//	overrides:
//	  training:
//	    otlp:
//	      translation_strategy: NoUTF8EscapingWithSuffixes
//	      promote_resource_attributes: [k8s.namespace.name, k8s.pod.name]
//	      convert_delta_to_cumulative: true
type OTLP struct {
	// TranslationStrategy is how OTLP names become metric and label names:
	// UnderscoreEscapingWithSuffixes (Prometheus' default),
	// UnderscoreEscapingWithoutSuffixes, NoUTF8EscapingWithSuffixes or NoTranslation.
	TranslationStrategy otlptranslator.TranslationStrategyOption `yaml:"translation_strategy"`
	// PromoteAllResourceAttributes makes every resource attribute a label
	// of each series (but those of ignore_resource_attributes).
	PromoteAllResourceAttributes bool `yaml:"promote_all_resource_attributes"`
	// PromoteResourceAttributes are the resource attributes made labels of
	// each series (e.g. k8s.namespace.name); the rest stay on target_info.
	PromoteResourceAttributes []string `yaml:"promote_resource_attributes,omitempty"`
	// IgnoreResourceAttributes are left out with promote_all_resource_attributes.
	IgnoreResourceAttributes []string `yaml:"ignore_resource_attributes,omitempty"`
	// KeepIdentifyingResourceAttributes keeps service.name,
	// service.namespace and service.instance.id on target_info too.
	KeepIdentifyingResourceAttributes bool `yaml:"keep_identifying_resource_attributes"`
	// ConvertHistogramsToNHCB stores explicit-bucket histograms as native
	// histograms with custom buckets instead of classic _bucket series.
	ConvertHistogramsToNHCB bool `yaml:"convert_histograms_to_nhcb"`
	// PromoteScopeMetadata adds the instrumentation scope's name, version,
	// schema URL and attributes as otel_scope_* labels.
	PromoteScopeMetadata bool `yaml:"promote_scope_metadata"`
	// LabelNameUnderscoreSanitization prepends "key_" to label names that
	// start with one underscore (not reserved "__" names) when names are
	// escaped.
	LabelNameUnderscoreSanitization bool `yaml:"label_name_underscore_sanitization"`
	// LabelNamePreserveMultipleUnderscores keeps runs of underscores in
	// escaped label names instead of collapsing them.
	LabelNamePreserveMultipleUnderscores bool `yaml:"label_name_preserve_multiple_underscores"`
	// ConvertDeltaToCumulative adds delta sums and histograms up into
	// cumulative ones (Prometheus' --enable-feature=otlp-deltatocumulative);
	// without it they are rejected, as Prometheus does by default.
	ConvertDeltaToCumulative bool `yaml:"convert_delta_to_cumulative"`
	// DisableTargetInfo leaves out the target_info series of each resource.
	DisableTargetInfo bool `yaml:"disable_target_info"`
}

// DefaultOTLP is Prometheus' default OTLP configuration.
func DefaultOTLP() OTLP {
	d := config.DefaultOTLPConfig
	return OTLP{
		TranslationStrategy:                  d.TranslationStrategy,
		LabelNameUnderscoreSanitization:      d.LabelNameUnderscoreSanitization,
		LabelNamePreserveMultipleUnderscores: d.LabelNamePreserveMultipleUnderscores,
	}
}

// Prometheus returns the settings as Prometheus' configuration block, which
// its translator reads.
func (o OTLP) Prometheus() config.OTLPConfig {
	return config.OTLPConfig{
		PromoteAllResourceAttributes:         o.PromoteAllResourceAttributes,
		PromoteResourceAttributes:            o.PromoteResourceAttributes,
		IgnoreResourceAttributes:             o.IgnoreResourceAttributes,
		TranslationStrategy:                  o.TranslationStrategy,
		KeepIdentifyingResourceAttributes:    o.KeepIdentifyingResourceAttributes,
		ConvertHistogramsToNHCB:              o.ConvertHistogramsToNHCB,
		PromoteScopeMetadata:                 o.PromoteScopeMetadata,
		LabelNameUnderscoreSanitization:      o.LabelNameUnderscoreSanitization,
		LabelNamePreserveMultipleUnderscores: o.LabelNamePreserveMultipleUnderscores,
	}
}

// Validate checks the settings with Prometheus' own rules: its block's
// YAML checks (promote and ignore lists), and the strategies its
// configuration accepts (gpustore stores UTF-8 names, so all four).
func (o OTLP) Validate() error {
	switch o.TranslationStrategy {
	case otlptranslator.UnderscoreEscapingWithSuffixes, otlptranslator.UnderscoreEscapingWithoutSuffixes,
		otlptranslator.NoUTF8EscapingWithSuffixes, otlptranslator.NoTranslation:
	default:
		return fmt.Errorf("otlp.translation_strategy %q: want one of %s, %s, %s, %s", o.TranslationStrategy,
			otlptranslator.UnderscoreEscapingWithSuffixes, otlptranslator.UnderscoreEscapingWithoutSuffixes,
			otlptranslator.NoUTF8EscapingWithSuffixes, otlptranslator.NoTranslation)
	}
	b, err := yaml.Marshal(o.Prometheus())
	if err != nil {
		return err
	}
	var check config.OTLPConfig
	if err := yaml.Unmarshal(b, &check); err != nil {
		return fmt.Errorf("otlp: %w", err)
	}
	return nil
}
